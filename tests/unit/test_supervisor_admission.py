"""The admission policy that keeps a supervisor to its own pod and its own job's Lease
(charts/slicekeeper/templates/admission.yaml, as the chart renders it), its CEL evaluated with
cel-python against allowed and forbidden requests, as the API server evaluates it: match conditions,
then variables, then every validation."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import kubernetes_validate
import pytest

from tests.support import chart

SUPERVISOR = "system:serviceaccount:team-a:slicekeeper-supervisor"
POD_NAME_CLAIM = "authentication.kubernetes.io/pod-name"


def documents(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return chart.rendered(values)["slicekeeper/templates/admission.yaml"]


POLICY = next(d for d in documents() if d["kind"] == "ValidatingAdmissionPolicy")


def evaluate(expression: str, activation: dict[str, Any]) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression)).evaluate(
        {name: celpy.json_to_cel(value) for name, value in activation.items()}
    )


def admitted(request: dict[str, Any], obj: dict[str, Any], policy: dict[str, Any] = POLICY) -> bool | None:
    """True: allowed; False: denied; None: the policy does not apply (another caller)."""
    spec = policy["spec"]
    activation: dict[str, Any] = {"request": request, "object": obj}
    if not all(evaluate(c["expression"], activation) for c in spec["matchConditions"]):
        return None
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:
        variables[variable["name"]] = evaluate(variable["expression"], {**activation, "variables": variables})
    activation["variables"] = variables
    return all(evaluate(v["expression"], activation) for v in spec["validations"])


def request(
    resource: str, *, user: str = SUPERVISOR, pod: str | None = "tiny-lm-s0-w1", sub: str = ""
) -> dict[str, Any]:
    extra = {POD_NAME_CLAIM: [pod]} if pod is not None else {}
    group = "coordination.k8s.io" if resource == "leases" else ""
    return {
        "userInfo": {"username": user, "extra": extra},
        "resource": {"group": group, "version": "v1", "resource": resource},
        "subResource": sub,
        "operation": "UPDATE",
    }


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"slicekeeper.dev/job": name.rsplit("-s", 1)[0]}}}


def lease(name: str, job: str | None) -> dict[str, Any]:
    labels = {"slicekeeper.dev/job": job} if job is not None else {}
    return {"metadata": {"name": name, "labels": labels}}


def test_the_policy_and_its_binding_are_valid_objects():
    kinds = [d["kind"] for d in documents()]
    assert kinds == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    for document in documents():
        kubernetes_validate.validate(document, "1.31", strict=True)


@pytest.mark.parametrize("sub", ["", "status"])
def test_a_supervisor_may_change_its_own_pod(sub):
    assert admitted(request("pods", sub=sub), pod("tiny-lm-s0-w1")) is True


@pytest.mark.parametrize(
    "target",
    ["tiny-lm-s0-w0", "tiny-lm-s1-w1", "other-job-s0-w1", "tiny-lm-s0-w1x"],
    ids=["its-jobs-other-host", "another-slice", "another-job", "a-longer-name"],
)
@pytest.mark.parametrize("sub", ["", "status"])
def test_a_supervisor_may_not_change_any_other_pod(target, sub):
    assert admitted(request("pods", sub=sub), pod(target)) is False


def test_a_supervisor_may_write_its_own_jobs_lease():
    assert admitted(request("leases"), lease("tiny-lm-leader", "tiny-lm")) is True


@pytest.mark.parametrize(
    ("name", "job"),
    [
        ("other-job-leader", "other-job"),  # another job's
        ("other-job-leader", "tiny-lm"),  # labelled as its own, named as another's
        ("tiny-lm-leader", None),  # no job label: whose is it?
        ("tiny-lm-other", "tiny-lm"),  # not the job's election Lease
        ("tiny.lm-leader", "tiny.lm"),  # a label that would read as a regular expression
        ("tiny-leader", "tiny"),  # a job whose name prefixes the caller's job
    ],
)
def test_a_supervisor_may_not_write_any_other_lease(name, job):
    assert admitted(request("leases"), lease(name, job)) is False


def test_a_regex_in_the_job_label_cannot_widen_whose_lease_it_is():
    """`tiny.lm` as a regular expression matches the pod `tinyXlm-s0-w0`: the label is refused."""
    caller = request("leases", pod="tinyXlm-s0-w0")
    assert admitted(caller, lease("tiny.lm-leader", "tiny.lm")) is False
    assert admitted(caller, lease("tinyXlm-leader", "tinyXlm")) is False  # upper case: no job name


def test_a_token_without_its_pod_may_change_nothing():
    legacy = request("pods", pod=None)
    assert admitted(legacy, pod("tiny-lm-s0-w1")) is False
    assert admitted(request("leases", pod=None), lease("tiny-lm-leader", "tiny-lm")) is False


def test_other_callers_are_not_this_policys_business():
    operator = request("pods", user="system:serviceaccount:slicekeeper-system:slicekeeper-operator")
    assert admitted(operator, pod("tiny-lm-s0-w0")) is None
    # A service account of the same name elsewhere is a supervisor too (every job namespace has one).
    assert (
        admitted(request("pods", user="system:serviceaccount:team-b:slicekeeper-supervisor"), pod("x"))
        is False
    )


def weakened(old: str, new: str) -> dict[str, Any]:
    """The policy with one validation's text changed: a deliberately wrong variant."""
    policy = copy.deepcopy(POLICY)
    for validation in policy["spec"]["validations"]:
        assert isinstance(validation["expression"], str)
        validation["expression"] = validation["expression"].replace(old, new)
    assert policy != POLICY, f"{old!r} is not in the policy"
    return policy


def test_the_checks_fail_on_a_policy_missing_a_condition():
    """Negative controls: without the name comparison another pod is admitted; without the job
    label's format, a regular expression in it lets a pod of another job write that job's Lease."""
    no_name = weakened("object.metadata.name == variables.podName", "true")
    assert admitted(request("pods"), pod("tiny-lm-s0-w0"), no_name) is True
    no_format = weakened("variables.job.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') &&", "")
    assert (
        admitted(request("leases", pod="tinyXlm-s0-w0"), lease("tiny.lm-leader", "tiny.lm"), no_format)
        is True
    )


def test_the_policy_follows_the_supervisors_service_account_the_chart_is_given():
    values = {"supervisors": {"serviceAccountName": "trainer"}}
    policy = next(d for d in documents(values) if d["kind"] == "ValidatingAdmissionPolicy")
    trainer = "system:serviceaccount:team-a:trainer"
    assert admitted(request("pods", user=trainer), pod("tiny-lm-s0-w2"), policy) is False  # not its own
    assert admitted(request("pods", user=trainer), pod("tiny-lm-s0-w1"), policy) is True
    assert admitted(request("pods"), pod("tiny-lm-s0-w2"), policy) is None  # no longer the supervisors'


def test_without_the_policy_the_chart_installs_none():
    assert documents({"supervisors": {"admissionPolicy": False}}) == []
