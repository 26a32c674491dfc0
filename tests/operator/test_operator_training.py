"""The whole cluster path on one machine: the real operator, the emulated API server, and pods run as
local processes by the fake scheduler and kubelet (tests/support/fake_kubelet.py).

A TrainingJob is applied and trains (JAX on CPU, one process per TPU host pod); a node is taken away
and the host is hot-swapped onto a spare node of its slice's pool; the next node loss leaves no
capacity, so after spec.health.replacementTimeoutSeconds the job scales down to one slice; a new
node brings the slice back (scale-up); deleting the job ends every process. A short job succeeds,
and so does the same job whose leader's pod is deleted mid-training, with the same parameters.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_kubelet import V5P_16_LABELS, FakeTpuCluster
from tests.support.operator_example import EXAMPLE, NS
from tests.support.operator_harness import Kube, emulated_cluster, eventually, operator

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

STARTUP = 180.0
"""Seconds for four JAX processes to start and compile on two shared cores."""

SHORT_STEPS = 30
FAULT_FREE: dict[int, str] = {}
"""steps -> the fault-free short job's final parameters' fingerprint (the first test records it)."""


def training_job(tmp: Path, steps: int) -> dict[str, Any]:
    job = copy.deepcopy(EXAMPLE)
    job["metadata"]["namespace"] = NS
    spec = job["spec"]
    spec["workload"]["steps"] = steps
    spec["workload"]["env"] = [
        {"name": "JAX_PLATFORMS", "value": "cpu"},
        {"name": "XLA_FLAGS", "value": "--xla_force_host_platform_device_count=2"},
    ]
    spec["checkpoint"]["persistent"]["uri"] = str(tmp / "persistent")  # shared storage, as GCS is
    spec["health"]["replacementTimeoutSeconds"] = 10
    return job


def status(kube: Kube) -> dict[str, Any]:
    return kube.job(NS, "tiny-lm").get("status") or {}


async def trains_past(kube: Kube, cluster: FakeTpuCluster, step: int, timeout: float = STARTUP) -> int:
    """Wait until the leader reports a step beyond `step`; returns it."""
    try:
        return await eventually(
            lambda: (status(kube).get("step") or 0) > step and status(kube)["step"],
            timeout=timeout,
            what=f"training past step {step}",
        )
    except AssertionError:
        print(cluster.log_of("tiny-lm-s0-w0")[-4000:])
        raise


def reasons(kube: Kube) -> list[str]:
    return [e["reason"] for e in kube.events(NS)]


async def test_a_job_trains_in_pods_survives_node_losses_and_scales_down_and_back_up(tmp_path: Path):
    async with (
        emulated_cluster() as kube,
        FakeTpuCluster(kube, tmp_path / "cluster", V5P_16_LABELS) as cluster,
        operator(kube),
    ):
        await cluster.add_pools({"pool-a": ["a-0", "a-1"], "pool-b": ["b-0", "b-1", "b-2"]})
        await kube.apply(training_job(tmp_path, steps=100_000))
        step = await trains_past(kube, cluster, 5)
        assert status(kube)["phase"] == "Running" and status(kube)["slicesReady"] == 2
        placed = {name: pod["spec"]["nodeName"] for name, pod in kube.pods(NS).items()}
        assert placed == {
            "tiny-lm-s0-w0": "a-0",
            "tiny-lm-s0-w1": "a-1",
            "tiny-lm-s1-w0": "b-0",
            "tiny-lm-s1-w1": "b-1",
        }

        # Node b-1 dies: host 3 is hot-swapped onto b-2, the spare node of its slice's pool.
        assert await cluster.lose_node("b-1") == ["tiny-lm-s1-w1"]
        moved = await eventually(
            lambda: (
                (kube.pods(NS).get("tiny-lm-s1-w1") or {}).get("spec", {}).get("nodeName") == "b-2"
                and kube.pods(NS)["tiny-lm-s1-w1"]
            ),
            what="host 3's pod on b-2",
        )
        assert moved["metadata"]["annotations"]["slicekeeper.dev/avoid-nodes"] == "b-1"
        step = await trains_past(kube, cluster, step)
        assert "HotSwap" in reasons(kube)
        assert status(kube)["restarts"]["host_lost"] >= 1 and status(kube)["restarts"]["replace"] == 1
        assert status(kube)["slicesActive"] == 2

        # Node b-2 dies too: no node is left in pool b, the replacement stays Pending, the policy
        # drops slice 1 after replacementTimeoutSeconds and training goes on with slice 0.
        await cluster.lose_node("b-2")
        await eventually(
            lambda: status(kube).get("slicesActive") == 1, timeout=STARTUP, what="scaled down to one slice"
        )
        await trains_past(kube, cluster, status(kube)["step"])
        scaled = next(c for c in status(kube)["conditions"] if c["type"] == "ScaledDown")
        assert scaled["status"] == "True" and "tiny-lm-s1-w1" in scaled["message"]
        assert "ScaleDown" in reasons(kube) and status(kube)["phase"] == "Running"

        # Capacity returns: the pending pod is scheduled, its supervisor joins, slice 1 is back.
        await cluster.add_node("b-3", "pool-b")
        await eventually(
            lambda: status(kube).get("slicesActive") == 2, timeout=STARTUP, what="scaled back up"
        )
        await trains_past(kube, cluster, status(kube)["step"])
        assert "ScaleUp" in reasons(kube)

        # Deleting the job ends every pod's process.
        await kube.delete_job(NS, "tiny-lm")
        await eventually(lambda: not kube.pods(NS), what="pods deleted")
        await eventually(
            lambda: all(p.process.poll() is not None for p in cluster.running.values()),
            timeout=30,
            what="every pod process ended",
        )


async def short_job(
    tmp_path: Path, steps: int = SHORT_STEPS, *, delete_leader_at: int | None = None
) -> dict[str, Any]:
    """The example job of `steps` steps run to its end on four pods; with `delete_leader_at`, the pod of
    the job's first leader (host 0) is deleted once training passed that step. Returns the final status."""
    async with (
        emulated_cluster() as kube,
        FakeTpuCluster(kube, tmp_path / "cluster", V5P_16_LABELS) as cluster,
        operator(kube),
    ):
        spare = ["a-2"] if delete_leader_at is not None else []  # a node for host 0's new pod
        await cluster.add_pools({"pool-a": ["a-0", "a-1", *spare], "pool-b": ["b-0", "b-1"]})
        await kube.apply(training_job(tmp_path, steps=steps))
        if delete_leader_at is not None:
            await trains_past(kube, cluster, delete_leader_at)
            await kube.delete_pod(NS, "tiny-lm-s0-w0")  # SIGTERM to its supervisor: the leader
        try:
            done = await eventually(
                lambda: status(kube).get("phase") in ("Succeeded", "Failed") and status(kube),
                timeout=STARTUP,
                what="the job finished",
            )
        except AssertionError:
            print(cluster.log_of("tiny-lm-s0-w0")[-4000:])
            raise
        try:
            await eventually(
                lambda: {p["status"]["phase"] for p in kube.pods(NS).values()} == {"Succeeded"},
                what="every pod Succeeded (its supervisor exited 0)",
            )
        except AssertionError:
            for name, pod in kube.pods(NS).items():
                print(name, pod["status"].get("phase"), pod["status"].get("containerStatuses"))
                print(cluster.log_of(name)[-2000:])
            raise
        return done


async def fault_free_fingerprint(tmp_path: Path, steps: int) -> str:
    if steps not in FAULT_FREE:
        done = await short_job(tmp_path / "fault-free", steps)
        FAULT_FREE[steps] = done["paramsFingerprint"]
    return FAULT_FREE[steps]


async def test_a_short_job_succeeds_in_pods(tmp_path: Path):
    done = await short_job(tmp_path)
    assert done["phase"] == "Succeeded", done
    assert done["step"] == SHORT_STEPS and done["lastCheckpointStep"] is not None
    assert 0 < done["goodput"] <= 1
    assert len(done["paramsFingerprint"]) == 64  # every host's final parameters agree
    FAULT_FREE[SHORT_STEPS] = done["paramsFingerprint"]


async def test_the_leaders_pod_deleted_mid_training_hands_the_job_over_with_nothing_lost(tmp_path: Path):
    """The leader's supervisor stands down and releases the job's Lease as its pod is deleted; another
    host's supervisor takes the Lease at once, carries on the job's memory and treats host 0 as lost;
    the operator's new pod for host 0 joins and the job ends as the fault-free run does."""
    done = await short_job(tmp_path, delete_leader_at=8)
    assert done["phase"] == "Succeeded", done
    assert done["step"] == SHORT_STEPS
    assert done["restarts"].get("host_lost", 0) >= 1, done["restarts"]
    assert done["paramsFingerprint"] == await fault_free_fingerprint(tmp_path, SHORT_STEPS)
