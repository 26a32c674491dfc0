"""End-to-end on a real cluster (kind with fake TPU nodes, or GKE): opt-in, `--with-e2e` and KUBECONFIG.

What no emulator shows: the real scheduler placing the operator's pods on TPU nodes (selectors,
taint, slice affinity, the `google.com/tpu` resource), the real image training through the supervisor,
and the operator's remediations against real node and pod life cycles: a hot-swap after a node loss,
a scale-down when a replacement cannot be scheduled and the scale-up when capacity returns, suspend.

Installs the chart (`helm install` through the Helm engine, tests/support/e2e_cluster.py) with the
e2e image and uninstalls it at the end, or uses an operator already installed; on kind, needs the
nodes made to look like TPU nodes (tests/support/fake_tpu_nodes.py: two pools of 2 hosts + 1 spare).
Each test creates its own namespace and deletes it at the end; nodes it cordons are uncordoned
whatever happens.
`SLICEKEEPER_E2E_IMAGE` names the image (default ghcr.io/slicekeeper/slicekeeper:latest; on kind use
a non-`latest` tag loaded with `kind load docker-image`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from slicekeeper.operator.hot_swap import AVOID_ANNOTATION
from slicekeeper.operator.render import ACCELERATOR_LABEL, NODE_POOL_LABEL, TOPOLOGY_LABEL, TPU_RESOURCE

from tests.support import e2e_cluster as cluster
from tests.support.e2e_cluster import Api, Cordons, describe, get_job, pods, reasons, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]

HOSTS = 4
"""examples/trainingjob.yaml: 2 slices of v5p-16, 2 hosts each."""
VICTIM = f"{cluster.JOB}-s1-w0"
SHORT_STEPS = 150
"""Scenario a: long enough to see the checkpoint step (every 5 steps) grow, short enough to finish."""
HOT_SWAP_STEPS = 400
"""Scenario b: the hot-swap happens near step 10 and training must still finish."""
ENDLESS_STEPS = 100_000
"""Scenarios c and d: training must outlast the test (the job is deleted with the namespace)."""
PODS_TIMEOUT = 600.0
"""Image start, JAX imports and scheduling of every pod (a first start on kind is slow)."""
CHECKPOINT_TIMEOUT = 900.0
"""From pods Running to a checkpoint: JAX's distributed start-up and compilation on CPU."""
FINISH_TIMEOUT = 1800.0


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    """The cluster, with the chart installed for these tests (or the operator found there)."""
    connected = cluster.connect()
    with cluster.chart_installed(connected):
        cluster.require_operator(connected)
        yield connected


@pytest.fixture
def cordons(api: Api) -> Iterator[Cordons]:
    with cluster.cordoning(api) as cordons:
        yield cordons


# --- waiting on the job --------------------------------------------------------------------------
def _status(api: Api, namespace: str) -> dict[str, Any]:
    """The job's status; a job that failed or is invalid fails the test at once, saying why."""
    status: dict[str, Any] = get_job(api, namespace).get("status") or {}
    if status.get("phase") in ("Failed", "Invalid"):
        raise AssertionError(f"the TrainingJob is {status['phase']}:\n{describe(api, namespace)}")
    return status


def _wait_status(
    api: Api, namespace: str, what: str, accept: Callable[[dict[str, Any]], bool], timeout: float
) -> dict[str, Any]:
    def accepted() -> dict[str, Any] | None:
        status = _status(api, namespace)
        return status if accept(status) else None

    return wait_for(what, accepted, timeout, state=lambda: describe(api, namespace))


def _wait_running_pods(api: Api, namespace: str, count: int = HOSTS) -> list[dict[str, Any]]:
    def running() -> list[dict[str, Any]] | None:
        _status(api, namespace)  # a failed job fails the wait at once
        found = [p for p in pods(api, namespace) if (p.get("status") or {}).get("phase") == "Running"]
        return found if len(found) == count else None

    return wait_for(
        f"{count} job pods Running", running, PODS_TIMEOUT, state=lambda: describe(api, namespace)
    )


def _wait_checkpoint(api: Api, namespace: str, after: int = 0) -> int:
    status = _wait_status(
        api,
        namespace,
        f"status.lastCheckpointStep above {after} (training progressing)",
        lambda s: (s.get("lastCheckpointStep") or 0) > after,
        CHECKPOINT_TIMEOUT,
    )
    return int(status["lastCheckpointStep"])


def _wait_event(api: Api, namespace: str, reason: str, timeout: float = 120.0) -> None:
    wait_for(
        f"a {reason} event on the TrainingJob",
        lambda: reason in reasons(api, namespace),
        timeout,
        state=lambda: describe(api, namespace),
    )


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


def _pod(api: Api, namespace: str, name: str) -> dict[str, Any] | None:
    return next((p for p in pods(api, namespace) if p["metadata"]["name"] == name), None)


def _replacement(api: Api, namespace: str, old_uid: str, phase: str | None = None) -> dict[str, Any] | None:
    """The pod named VICTIM that is not the one deleted (same name, new uid), in `phase` if given."""
    pod = _pod(api, namespace, VICTIM)
    if pod is None or pod["metadata"]["uid"] == old_uid:
        return None
    return pod if phase is None or (pod.get("status") or {}).get("phase") == phase else None


def _tpu_nodes(api: Api, selector: dict[str, str]) -> list[dict[str, Any]]:
    """Every node the job's pods may run on (they select these labels)."""
    label_selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
    return list(api.plain(api.core.list_node(label_selector=label_selector))["items"])


# --- the scenarios -------------------------------------------------------------------------------
def test_the_example_job_trains_on_tpu_nodes_until_it_succeeds(api: Api) -> None:
    with cluster.job_namespace(api, "train") as namespace:
        cluster.create_job(api, cluster.training_job(namespace, steps=SHORT_STEPS))
        running = _wait_running_pods(api, namespace)

        pools: dict[str, set[str]] = {}
        for pod in running:
            node = api.plain(api.core.read_node(pod["spec"]["nodeName"]))
            labels, selector = node["metadata"]["labels"], pod["spec"]["nodeSelector"]
            name = pod["metadata"]["name"]
            for key in (ACCELERATOR_LABEL, TOPOLOGY_LABEL):
                assert labels.get(key) == selector[key], f"{name} on {node['metadata']['name']}: {key}"
            assert TPU_RESOURCE in node["status"]["allocatable"], f"{name}'s node has no {TPU_RESOURCE}"
            pools.setdefault(pod["metadata"]["labels"]["slicekeeper.dev/slice"], set()).add(
                labels.get(NODE_POOL_LABEL, "")
            )
        assert all(len(p) == 1 for p in pools.values()), f"a slice spans node pools: {pools}"
        assert len(set.union(*pools.values())) == len(pools), f"two slices share a node pool: {pools}"

        first = _wait_checkpoint(api, namespace)
        _wait_checkpoint(api, namespace, after=first)
        status = _wait_status(
            api, namespace, "phase Succeeded", lambda s: s.get("phase") == "Succeeded", FINISH_TIMEOUT
        )
        assert status.get("slicesTotal") == 2, status
        assert "Created" in reasons(api, namespace), describe(api, namespace)


def test_a_lost_node_is_hot_swapped_and_training_finishes(api: Api, cordons: Cordons) -> None:
    with cluster.job_namespace(api, "hotswap") as namespace:
        cluster.create_job(api, cluster.training_job(namespace, steps=HOT_SWAP_STEPS))
        _wait_running_pods(api, namespace)
        _wait_checkpoint(api, namespace, after=5)

        victim = _pod(api, namespace, VICTIM)
        assert victim is not None, describe(api, namespace)
        old_node, old_uid = victim["spec"]["nodeName"], victim["metadata"]["uid"]
        pool = api.plain(api.core.read_node(old_node))["metadata"]["labels"].get(NODE_POOL_LABEL)
        busy = {p["spec"].get("nodeName") for p in pods(api, namespace)}
        spares = [
            n["metadata"]["name"]
            for n in _tpu_nodes(api, victim["spec"]["nodeSelector"])
            if n["metadata"]["labels"].get(NODE_POOL_LABEL) == pool
            and n["metadata"]["name"] not in busy
            and not n["spec"].get("unschedulable")
        ]
        assert spares, (
            f"no free node in {VICTIM}'s pool {pool} for its replacement (the slice affinity keeps it in "
            f"that pool): give every pool a spare node (tests/support/fake_tpu_nodes.py, docs/kind.md)"
        )

        # A node loss as the operator sees it: the node is gone for scheduling, the pod disappears.
        cordons.cordon(old_node)
        api.core.delete_namespaced_pod(VICTIM, namespace, grace_period_seconds=0)

        fresh = wait_for(
            f"a replacement {VICTIM} Running on another node",
            lambda: _replacement(api, namespace, old_uid, phase="Running"),
            PODS_TIMEOUT,
            state=lambda: describe(api, namespace),
        )
        assert fresh["spec"]["nodeName"] != old_node, f"the replacement went back to {old_node}"
        avoided = (fresh["metadata"].get("annotations") or {}).get(AVOID_ANNOTATION, "")
        assert old_node in avoided.split(","), f"{AVOID_ANNOTATION}={avoided!r} does not name {old_node}"
        _wait_event(api, namespace, "HotSwap")

        status = _wait_status(
            api,
            namespace,
            "phase Succeeded after the hot-swap",
            lambda s: s.get("phase") == "Succeeded",
            FINISH_TIMEOUT,
        )
        assert (status.get("restarts") or {}).get("replace", 0) >= 1, f"status.restarts: {status}"


def test_no_capacity_scales_down_and_capacity_back_scales_up(api: Api, cordons: Cordons) -> None:
    timeout = 30.0
    with cluster.job_namespace(api, "elastic") as namespace:
        job = cluster.training_job(namespace, steps=ENDLESS_STEPS, replacement_timeout=timeout)
        cluster.create_job(api, job)
        _wait_running_pods(api, namespace)
        _wait_checkpoint(api, namespace)

        victim = _pod(api, namespace, VICTIM)
        assert victim is not None, describe(api, namespace)
        old_node, old_uid = victim["spec"]["nodeName"], victim["metadata"]["uid"]
        busy = {p["spec"].get("nodeName") for p in pods(api, namespace)}
        for node in _tpu_nodes(api, victim["spec"]["nodeSelector"]):
            if node["metadata"]["name"] not in busy:
                cordons.cordon(node["metadata"]["name"])
        cordons.cordon(old_node)
        api.core.delete_namespaced_pod(VICTIM, namespace, grace_period_seconds=0)

        wait_for(
            f"a replacement {VICTIM} (Pending: no node has room)",
            lambda: _replacement(api, namespace, old_uid),
            60.0,
            state=lambda: describe(api, namespace),
        )
        status = _wait_status(
            api,
            namespace,
            f"condition ScaledDown True and slicesActive 1 (replacementTimeoutSeconds {timeout:.0f})",
            lambda s: _condition(s, "ScaledDown").get("status") == "True" and s.get("slicesActive") == 1,
            timeout + 180.0,
        )
        assert status.get("slicesTotal") == 2, status
        pending = _replacement(api, namespace, old_uid)
        assert pending is not None and not pending["spec"].get("nodeName"), (
            f"the replacement was scheduled with every spare node cordoned:\n{describe(api, namespace)}"
        )
        _wait_event(api, namespace, "ScaleDown")

        cordons.release()
        wait_for(
            f"the replacement {VICTIM} Running once capacity is back",
            lambda: _replacement(api, namespace, old_uid, phase="Running"),
            PODS_TIMEOUT,
            state=lambda: describe(api, namespace),
        )
        _wait_event(api, namespace, "ScaleUp", timeout=PODS_TIMEOUT)
        _wait_status(api, namespace, "slicesActive back to 2", lambda s: s.get("slicesActive") == 2, 300.0)


def test_suspend_deletes_the_pods_and_resume_brings_them_back(api: Api) -> None:
    with cluster.job_namespace(api, "suspend") as namespace:
        cluster.create_job(api, cluster.training_job(namespace, steps=ENDLESS_STEPS))
        _wait_running_pods(api, namespace)
        _wait_status(api, namespace, "phase Running", lambda s: s.get("phase") == "Running", PODS_TIMEOUT)

        cluster.patch_spec(api, namespace, {"suspend": True})
        wait_for(
            "every job pod deleted after spec.suspend: true",
            lambda: not pods(api, namespace),
            300.0,
            state=lambda: describe(api, namespace),
        )
        _wait_status(api, namespace, "phase Suspended", lambda s: s.get("phase") == "Suspended", 120.0)
        _wait_event(api, namespace, "Suspended")

        cluster.patch_spec(api, namespace, {"suspend": False})
        _wait_running_pods(api, namespace)
        _wait_status(
            api,
            namespace,
            "phase Running after resuming",
            lambda s: s.get("phase") == "Running",
            PODS_TIMEOUT,
        )
        _wait_event(api, namespace, "Resumed")
