"""A job that leaves the cluster and comes back continues from its persistent checkpoint, nothing lost.

The real operator, the emulated API server and pods run as local processes (tests/support/
fake_kubelet.py); the job is the example two-slice JAX job, checked against the fault-free local run of
the same job (`clean`, tests/support/example_runs.py: same model, same data, same checkpoints).

- Suspended (`spec.suspend: true`) after its first persistent step (30), the job's pods go; resumed,
  the new pods' leader finds step 30 in the persistent tier and every host restores it: the status
  says so (`lastRestore`), and the persistent step 60 it then saves is bit for bit the fault-free
  run's.
- Deleted and created again under the same name (a new run of the same TrainingJob), the job
  continues from step 60 to the fault-free run's last and ends with its parameters.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.support.cli_runs import EXAMPLE
from tests.support.cluster_emulator import TRAININGJOBS
from tests.support.example_runs import (
    DEVICES_PER_HOST,
    PERSISTENT_INTERVAL,
    STEPS,
    final_params,
    persistent_step,
)
from tests.support.fake_kubelet import V5P_16_LABELS, FakeTpuCluster
from tests.support.operator_example import PROGRAMS_CLAIM, shared_claims
from tests.support.operator_harness import Kube, emulated_cluster, eventually, operator
from tests.support.pod_events import steps_ended
from tests.support.xla_flags import with_cheap_compile

pytestmark = [pytest.mark.asyncio, pytest.mark.slow, pytest.mark.timeout(1800)]

STARTUP = 180.0
"""Seconds for four JAX processes to start and compile on two shared cores."""
NS = "research"
FIRST, SECOND = PERSISTENT_INTERVAL, 2 * PERSISTENT_INTERVAL
"""The persistent steps the suspended run and the resumed one end after (the fault-free run keeps both)."""


IGNORE_STRAGGLERS = """
from slicekeeper.policy import Ignore

def on_straggler(event, context):
    return Ignore()
"""
"""The job's policy: the default ladder, but a straggler is only reported. On a loaded two-core
machine a host's share of the cores is uneven enough to be scored a straggler now and then; replacing
it finds no free node here, and after replacementTimeoutSeconds the default ladder scales the job
down, whose parameters equal the fault-free run's only up to float summation order, while this test
checks resuming bit for bit."""


def resumable_job(where: Path, steps: int) -> dict[str, Any]:
    """The example job as `clean` runs it (seed, checkpoints, a persistent step every
    PERSISTENT_INTERVAL, its devices a host), its persistent tier and final parameters in `where`,
    shared storage for every pod."""
    job = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"]["namespace"] = NS
    spec = job["spec"]
    spec["policy"] = {"source": IGNORE_STRAGGLERS}
    spec["workload"]["steps"] = steps
    spec["workload"]["args"] = ["--seed", "0", "--final-params", str(where / "params.npz")]
    spec["workload"]["env"] = [
        {"name": "JAX_PLATFORMS", "value": "cpu"},
        {
            "name": "XLA_FLAGS",
            "value": with_cheap_compile(f"--xla_force_host_platform_device_count={DEVICES_PER_HOST}"),
        },
    ]
    spec["workload"]["compilationCache"] = {"claimName": PROGRAMS_CLAIM}  # three starts, one compile
    spec["checkpoint"]["persistent"] = {
        "uri": str(where / "persistent"),
        "interval": PERSISTENT_INTERVAL,
        "maxToKeep": 2,
    }
    return job


def status(kube: Kube) -> dict[str, Any]:
    return kube.job(NS, "tiny-lm").get("status") or {}


def committed(where: Path) -> list[int]:
    markers = where.glob("persistent/**/COMMITTED")
    return sorted(int(marker.parent.name.removeprefix("step-")) for marker in markers)


def manifests(step_folder: Path) -> dict[str, Any]:
    """Each host's manifest of a persistent step (names, sizes and sha256 of its shard files)."""
    found = {}
    for manifest in sorted(step_folder.glob("host-*/manifest.json")):
        found[manifest.parent.name] = json.loads(manifest.read_text())
    return found


def assert_same_shards(run: Path, clean: Path, step: int, cluster: FakeTpuCluster) -> None:
    """Every host's persistent shard of `step` is bit for bit the fault-free run's; when not, the
    differing shards and the pods' logs say where the runs parted."""
    ours, theirs = manifests(persistent_step(run, step)), manifests(persistent_step(clean, step))
    if ours == theirs:
        return
    differing = {
        host: sorted(
            name
            for name, shard in ours.get(host, {}).get("shards", {}).items()
            if theirs.get(host, {}).get("shards", {}).get(name) != shard
        )
        for host in sorted(ours.keys() | theirs.keys())
    }
    for pod in sorted({p.name for p in cluster.running.values()}):
        print(f"--- {pod}\n{cluster.log_of(pod)[-3000:]}")
    raise AssertionError(f"persistent step {step} differs from the fault-free run's: {differing}")


async def finished(kube: Kube, cluster: FakeTpuCluster, what: str) -> dict[str, Any]:
    try:
        done = await eventually(
            lambda: status(kube).get("phase") in ("Succeeded", "Failed") and status(kube),
            timeout=2 * STARTUP,
            what=what,
        )
    except AssertionError:
        print(cluster.log_of("tiny-lm-s0-w0")[-4000:])
        raise
    assert done["phase"] == "Succeeded", (done, cluster.log_of("tiny-lm-s0-w0")[-4000:])
    return done


async def no_pods_left(kube: Kube, cluster: FakeTpuCluster) -> None:
    await eventually(lambda: not kube.pods(NS), timeout=60, what="the job's pods deleted")
    await eventually(
        lambda: all(p.process.poll() is not None for p in cluster.running.values()),
        timeout=30,
        what="every pod process ended",
    )


async def test_a_suspended_job_resumes_from_its_persistent_step_and_a_recreated_one_loses_nothing(
    tmp_path: Path, clean: dict[str, Any]
):
    async with (
        emulated_cluster() as kube,
        FakeTpuCluster(kube, tmp_path / "cluster", V5P_16_LABELS, claims=shared_claims()) as cluster,
        operator(kube),
    ):
        await cluster.add_pools({"pool-a": ["a-0", "a-1"], "pool-b": ["b-0", "b-1"]})
        await kube.apply(resumable_job(tmp_path, steps=SECOND))

        # Suspended once the first persistent step is committed and training went past it.
        await eventually(
            lambda: committed(tmp_path) == [FIRST] and steps_ended(cluster) > FIRST + 2,
            timeout=2 * STARTUP,
            what=f"persistent step {FIRST} committed and training past it",
        )
        await kube.patch_job(NS, "tiny-lm", {"spec": {"suspend": True}})
        await no_pods_left(kube, cluster)
        reached = steps_ended(cluster)  # the pods' logs: the status can be a publish (5 s) behind
        assert committed(tmp_path) == [FIRST] and FIRST < reached < SECOND
        # What the resumed job starts from is the fault-free run's step FIRST (else a difference at
        # step SECOND below would be the first run's, not the resume's).
        assert_same_shards(tmp_path, clean["where"], FIRST, cluster)

        # Resumed: the new pods' leader restores step FIRST from the persistent tier, not step 0.
        await kube.patch_job(NS, "tiny-lm", {"spec": {"suspend": False}})
        done = await finished(kube, cluster, "the resumed job finished")
        assert done["step"] == SECOND
        assert done["lastRestore"] == {"generation": 0, "cause": "resume", "step": FIRST, "stepsReplayed": 0}
        # Whichever host's supervisor won the job's Lease led the resumed run.
        logs = [cluster.log_of(f"tiny-lm-s{s}-w{w}") for s in (0, 1) for w in (0, 1)]
        assert any(f"generation 0 starting from step {FIRST} of an earlier run" in log for log in logs)
        assert_same_shards(tmp_path, clean["where"], SECOND, cluster)

        # A new run of the same TrainingJob (deleted, created again) continues from step SECOND.
        await kube.delete_job(NS, "tiny-lm")
        await no_pods_left(kube, cluster)
        # Gone once the operator let go of it (its finalizer): created again before, it is a 409.
        await eventually(lambda: not kube.emulator.live(TRAININGJOBS, NS), timeout=60, what="the job gone")
        await kube.apply(resumable_job(tmp_path, steps=STEPS))
        done = await finished(kube, cluster, "the re-created job finished")
        assert done["step"] == STEPS
        assert done["lastRestore"] == {"generation": 0, "cause": "resume", "step": SECOND, "stepsReplayed": 0}
        params = final_params(tmp_path)
        assert params.keys() == clean["params"].keys()
        for name, value in params.items():
            np.testing.assert_array_equal(value, clean["params"][name], err_msg=name)
