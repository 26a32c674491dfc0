"""What the opt-in cluster tests assume, checked offline: the fake TPU nodes fit the pods, the jobs are valid.

The e2e tests (tests/e2e) cannot run here; these catch the drift that would only show on kind: a
label or resource render.py changes but fake_tpu_nodes.py does not, a pool without the spare node a
hot-swap needs, or an e2e job the TrainingJob model refuses.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from slicekeeper.operator.render import NODE_POOL_LABEL, TPU_RESOURCE, render

from slicekeeper.api import load_training_job, parse_training_job
from tests.support import chart
from tests.support import e2e_cluster as cluster
from tests.support.cli_runs import EXAMPLE
from tests.support.fake_tpu_nodes import FakeTpuNode, plan

KIND_WORKERS = ["kind-worker", *(f"kind-worker{i}" for i in range(2, 8))]


def tolerated(taint: dict[str, str], tolerations: list[dict[str, Any]]) -> bool:
    for toleration in tolerations:
        if toleration.get("key") not in (None, taint["key"]):
            continue
        if toleration.get("effect") not in (None, "", taint["effect"]):
            continue
        if toleration.get("operator", "Equal") == "Exists" or toleration.get("value") == taint.get("value"):
            return True
    return False


def test_the_fake_tpu_nodes_take_the_example_pods_one_per_node_with_a_spare_per_pool():
    job = load_training_job(EXAMPLE)
    nodes = plan(job, KIND_WORKERS)
    pods = list(render(job).pods())
    assert len(nodes) == 6 and len(pods) == 4
    for node in nodes:
        for pod in pods:
            spec = pod["spec"]
            assert spec["nodeSelector"].items() <= node.labels.items(), node.name
            assert tolerated(node.taint, spec["tolerations"]), node.name
            request = int(spec["containers"][0]["resources"]["requests"][TPU_RESOURCE])
            assert request <= int(node.capacity[TPU_RESOURCE]) < 2 * request, "one TPU pod per node"
    # The slice affinity keeps a slice's pods, and their replacements, in one pool.
    topology = pods[0]["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert topology[0]["topologyKey"] == NODE_POOL_LABEL
    pools: dict[str, list[FakeTpuNode]] = {}
    for node in nodes:
        assert node.labels[NODE_POOL_LABEL] == node.pool
        pools.setdefault(node.pool, []).append(node)
    assert len(pools) == job.spec.slices
    assert all(len(members) == job.slice_shape.host_count + 1 for members in pools.values())


def test_workers_are_taken_in_kind_order_and_one_stays_plain_for_the_operator():
    workers = [*KIND_WORKERS, "kind-worker10"]
    random.Random(0).shuffle(workers)
    nodes = plan(load_training_job(EXAMPLE), workers)
    assert [n.name for n in nodes] == KIND_WORKERS[:6]
    with pytest.raises(ValueError, match="7 kind workers, found 6"):
        plan(load_training_job(EXAMPLE), KIND_WORKERS[:6])


def test_the_e2e_jobs_are_valid_training_jobs_for_the_e2e_image():
    document = cluster.training_job("sk-e2e-x", steps=400, replacement_timeout=30.0)
    job = parse_training_job(document, "the e2e job")
    assert job.metadata.name == cluster.JOB and job.spec.workload.steps == 400
    assert job.spec.health.replacement_timeout_seconds == 30.0
    assert job.spec.suspend is False
    pods = {p["metadata"]["name"]: p for p in render(job).pods()}
    assert f"{cluster.JOB}-s1-w0" in pods  # the pod the hot-swap and scale-down tests delete
    box = pods[f"{cluster.JOB}-s1-w0"]["spec"]["containers"][0]
    assert box["image"] == cluster.IMAGE
    env = {e["name"]: e.get("value") for e in box["env"]}
    assert env.get("JAX_PLATFORMS") == (cluster.JAX_PLATFORMS or None)


@pytest.mark.parametrize(
    ("image", "repository", "tag"),
    [
        ("ghcr.io/slicekeeper/slicekeeper:kind", "ghcr.io/slicekeeper/slicekeeper", "kind"),
        ("localhost:5000/slicekeeper", "localhost:5000/slicekeeper", "latest"),  # a registry's port
        ("localhost:5000/slicekeeper:e2e", "localhost:5000/slicekeeper", "e2e"),
        ("slicekeeper", "slicekeeper", "latest"),  # as the training pods get it, not the appVersion
    ],
)
def test_the_e2e_image_becomes_the_charts_image_values(image, repository, tag):
    values = cluster.image_values(image)
    assert (values["repository"], values["tag"]) == (repository, tag)


@pytest.mark.parametrize("monitoring", [False, True])
def test_the_e2e_install_values_are_the_charts_and_run_the_e2e_image(monitoring):
    """What the e2e tests `helm install`: accepted by the chart's schema, every object valid, the
    operator on the e2e image, the Prometheus Operator's kinds only where the cluster has them."""
    image = "ghcr.io/slicekeeper/slicekeeper:kind"
    values = cluster.install_values(image, monitoring=monitoring)
    installed = chart.objects(values)
    assert chart.invalid(installed) == {}
    deployment = chart.the("Deployment", cluster.OPERATOR_DEPLOYMENT, values)
    assert deployment["metadata"]["namespace"] == cluster.OPERATOR_NAMESPACE
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == image
    monitors = {o["kind"] for o in installed if o["apiVersion"].startswith(cluster.MONITORING_GROUP)}
    assert monitors == ({"PodMonitor", "PrometheusRule"} if monitoring else set())
    assert not [
        o for o in installed if o["kind"] == "ServiceAccount" and o["metadata"]["namespace"] == "default"
    ]
