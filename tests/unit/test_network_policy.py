"""A job's NetworkPolicy (operator/render.py): only the job's own pods reach its pods, and only the
monitoring namespace reaches their metrics port (docs/security.md). Evaluated with the network
model's rules (tests/support/network_policy.py), with negative controls."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
from slicekeeper.operator.render import PORTS, manifests, render

from slicekeeper import protocol
from slicekeeper.api import dump_training_job, load_training_job, parse_training_job
from tests.support.cli_runs import ROOT
from tests.support.network_policy import Endpoint, admits

EXAMPLE = ROOT / "examples" / "trainingjob.yaml"
JOB = load_training_job(EXAMPLE)
NAMESPACE = JOB.metadata.namespace or "default"
OWN = Endpoint(NAMESPACE, {protocol.LABEL_JOB: "tiny-lm", "slicekeeper.dev/slice": "1"})
TARGET = Endpoint(NAMESPACE, {protocol.LABEL_JOB: "tiny-lm", "slicekeeper.dev/slice": "0"})
OTHER_JOB = Endpoint(NAMESPACE, {protocol.LABEL_JOB: "other"})
STRANGER = Endpoint(NAMESPACE, {"app": "web"})
PROMETHEUS = Endpoint("monitoring", {"app": "prometheus"})
ELSEWHERE = Endpoint("team-b", {protocol.LABEL_JOB: "tiny-lm"})  # same labels, another namespace
SUPERVISOR_PORTS = [PORTS["sk-coord"], PORTS["jax-coord"], PORTS["tpu-runtime"], PORTS["megascale"], 40123]
"""The supervisors, JAX and the TPU runtime; 40123: a peer-tier port (ephemeral, any)."""


def policy_of(job: Any = JOB) -> dict[str, Any]:
    policy = render(job).network_policy()
    policy["metadata"].setdefault("namespace", NAMESPACE)
    return policy


def test_the_policy_is_a_valid_object_rendered_with_the_other_children():
    policy = policy_of()
    kubernetes_validate.validate(policy, "1.31", strict=True)
    assert [m["kind"] for m in manifests(render(JOB))][:3] == ["Service", "ConfigMap", "NetworkPolicy"]
    assert policy["metadata"]["labels"][protocol.LABEL_JOB] == "tiny-lm"


@pytest.mark.parametrize("port", [*SUPERVISOR_PORTS, PORTS["metrics"]])
def test_the_jobs_own_pods_reach_every_port(port):
    assert admits(policy_of(), OWN, TARGET, port)


@pytest.mark.parametrize("source", [OTHER_JOB, STRANGER, ELSEWHERE, PROMETHEUS], ids=lambda e: str(e.labels))
@pytest.mark.parametrize("port", SUPERVISOR_PORTS)
def test_no_other_pod_reaches_the_supervisors_or_the_runtime(source, port):
    assert not admits(policy_of(), source, TARGET, port)


def test_only_the_monitoring_namespace_reaches_the_metrics_port():
    metrics = PORTS["metrics"]
    assert admits(policy_of(), PROMETHEUS, TARGET, metrics)
    for source in (OTHER_JOB, STRANGER, ELSEWHERE):
        assert not admits(policy_of(), source, TARGET, metrics), source


def test_the_monitoring_namespace_is_configurable_or_none():
    document = dump_training_job(JOB)
    document["spec"]["network"] = {"metricsNamespace": "observability"}
    elsewhere = policy_of(parse_training_job(document))
    assert admits(elsewhere, Endpoint("observability"), TARGET, PORTS["metrics"])
    assert not admits(elsewhere, PROMETHEUS, TARGET, PORTS["metrics"])
    document["spec"]["network"] = {"metricsNamespace": None}
    closed = policy_of(parse_training_job(document))
    assert not admits(closed, PROMETHEUS, TARGET, PORTS["metrics"])
    assert admits(closed, OWN, TARGET, PORTS["metrics"])


def test_the_checks_fail_on_a_weaker_policy():
    """Negative controls: without the port limit the monitoring namespace reaches the supervisors;
    a policy selecting no pod of the job isolates nothing."""
    unlimited = copy.deepcopy(policy_of())
    del unlimited["spec"]["ingress"][1]["ports"]
    assert admits(unlimited, PROMETHEUS, TARGET, PORTS["sk-coord"])
    elsewhere = copy.deepcopy(policy_of())
    elsewhere["spec"]["podSelector"] = {"matchLabels": {protocol.LABEL_JOB: "another"}}
    assert admits(elsewhere, STRANGER, TARGET, PORTS["sk-coord"])
