"""The pods slicekeeper renders, and the operator's own, meet the "restricted" Pod Security Standard
(docs/security.md says what that asks of a TPU pod); the checks (tests/support/pod_security.py) fail
on pods missing each setting."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from slicekeeper.operator.render import render

from slicekeeper.api import load_training_job
from tests.support import chart
from tests.support.cli_runs import ROOT
from tests.support.pod_security import restricted_violations

EXAMPLES = sorted((ROOT / "examples").glob("trainingjob*.yaml"))


def example_pod() -> dict[str, Any]:
    return next(render(load_training_job(ROOT / "examples" / "trainingjob.yaml")).pods())


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_rendered_tpu_pod_is_restricted(path):
    for pod in render(load_training_job(path)).pods():
        assert restricted_violations(pod["spec"]) == [], pod["metadata"]["name"]


def test_the_operators_pod_is_restricted():
    deployment = chart.the("Deployment")
    assert restricted_violations(deployment["spec"]["template"]["spec"]) == []


def test_a_tpu_pod_runs_as_the_images_non_root_user_without_privileges():
    spec = example_pod()["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = spec["containers"]
    context = container["securityContext"]
    assert context == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def without(pod: dict[str, Any], *path: str) -> dict[str, Any]:
    """`pod`'s spec with the field at `path` (from the spec; an int picks a list item) removed."""
    spec = copy.deepcopy(pod["spec"])
    parent: Any = spec
    for key in path[:-1]:
        parent = parent[int(key)] if isinstance(parent, list) else parent[key]
    del parent[path[-1]]
    return spec


@pytest.mark.parametrize(
    ("path", "control"),
    [
        (("securityContext", "runAsNonRoot"), "running as non-root"),
        (("securityContext", "seccompProfile"), "seccomp"),
        (("containers", "0", "securityContext", "allowPrivilegeEscalation"), "privilege escalation"),
        (("containers", "0", "securityContext", "capabilities"), "capabilities"),
    ],
)
def test_the_checks_find_a_pod_missing_each_setting(path, control):
    """Negative controls: the rendered pod with one setting removed is not restricted."""
    found = restricted_violations(without(example_pod(), *path))
    assert found and all(f.startswith(control) for f in found), found


def test_the_checks_find_what_a_privileged_tpu_pod_of_old_used():
    """GKE before 1.28 ran TPU containers privileged; the profile refuses that, and host paths."""
    spec = copy.deepcopy(example_pod()["spec"])
    spec["containers"][0]["securityContext"]["privileged"] = True
    spec["volumes"].append({"name": "dev", "hostPath": {"path": "/dev"}})
    found = restricted_violations(spec)
    assert any(f.startswith("privileged containers") for f in found), found
    assert any(f.startswith("volume types: dev") for f in found), found
