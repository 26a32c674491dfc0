"""The whole cluster path on one machine: the real operator, the emulated API server, and pods run as
local processes by the fake scheduler and kubelet (tests/support/fake_kubelet.py).

A TrainingJob is applied and trains (JAX on CPU, one process per TPU host pod); a node is taken away
and the host is hot-swapped onto a spare node of its slice's pool; the next node loss leaves no
capacity, so after spec.health.replacementTimeoutSeconds the job scales down to one slice; a new
node brings the slice back (scale-up); deleting the job ends every process.
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


async def test_a_short_job_succeeds_in_pods(tmp_path: Path):
    async with (
        emulated_cluster() as kube,
        FakeTpuCluster(kube, tmp_path / "cluster", V5P_16_LABELS) as cluster,
        operator(kube),
    ):
        await cluster.add_pools({"pool-a": ["a-0", "a-1"], "pool-b": ["b-0", "b-1"]})
        await kube.apply(training_job(tmp_path, steps=30))
        try:
            done = await eventually(
                lambda: status(kube).get("phase") in ("Succeeded", "Failed") and status(kube),
                timeout=STARTUP,
                what="the job finished",
            )
        except AssertionError:
            print(cluster.log_of("tiny-lm-s0-w0")[-4000:])
            raise
        assert done["phase"] == "Succeeded", done
        assert done["step"] == 30 and done["lastCheckpointStep"] is not None
        assert 0 < done["goodput"] <= 1
        await eventually(
            lambda: {p["status"]["phase"] for p in kube.pods(NS).values()} == {"Succeeded"},
            what="every pod Succeeded (its supervisor exited 0)",
        )
