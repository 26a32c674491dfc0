"""A job that leaves the cluster and comes back continues from its persistent checkpoint, nothing lost.

The real operator, the emulated API server and pods run as local processes (tests/support/
fake_kubelet.py). The job is the example two-slice job with the SDK loop's model in lockstep
(tests/fixtures/checkpointed_lockstep_loop.py), whose parameters after N steps are known in advance
(`sdk_loop_fingerprint`) and whose hosts each keep a shard of their own that a wrong restore gives
away: what is checked here is what the operator and the supervisors do when a job leaves and comes
back, not JAX. (It ran the JAX job until stop 55: three generations of four JAX processes, 119 s of
the suite's CPU for this one test; the JAX job's restore from the persistent tier is checked in
tests/chaos/test_jax_recovery.py, its checkpoint format in tests/integration/test_checkpoint_formats.py.)

- Suspended (`spec.suspend: true`) after its first persistent step, the job's pods go; resumed, the
  new pods' leader finds the newest persistent step and every host restores it: the status says so
  (`lastRestore`), and the job ends with the fault-free parameters of its length.
- Deleted and created again under the same name (a new run of the same TrainingJob), longer, the
  job continues from the first run's last step and ends with the fault-free parameters.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli_runs import EXAMPLE, ROOT, sdk_loop_fingerprint
from tests.support.cluster_emulator import TRAININGJOBS
from tests.support.fake_kubelet import V5P_16_LABELS, FakeTpuCluster
from tests.support.operator_harness import Kube, emulated_cluster, eventually, operator
from tests.support.pod_events import steps_ended

pytestmark = [pytest.mark.asyncio, pytest.mark.slow, pytest.mark.timeout(600)]

STARTUP = 120.0
"""Seconds for a job's four pods to start and finish, on a loaded machine."""
NS = "research"
LOOP = ROOT / "tests" / "fixtures" / "checkpointed_lockstep_loop.py"
PERSISTENT_INTERVAL = 30
SECOND, LONGER = 6 * PERSISTENT_INTERVAL, 8 * PERSISTENT_INTERVAL
"""Steps of the suspended and resumed run (a persistent step, which the re-created run starts from),
and of the re-created run. The loop's steps take about 60 ms: the suspension, from the patch to
every pod gone, must land within the 150 steps after the first persistent one."""
EXAMPLE_JOB = yaml.safe_load(EXAMPLE.read_text())
POD_NAMES = [f"tiny-lm-s{s}-w{w}" for s in (0, 1) for w in (0, 1)]


def resumable_job(where: Path, steps: int) -> dict[str, Any]:
    """The example job with the lockstep loop, its persistent tier in `where` (shared storage for
    every pod, a step every PERSISTENT_INTERVAL)."""
    job = copy.deepcopy(EXAMPLE_JOB)
    job["metadata"]["namespace"] = NS
    spec = job["spec"]
    spec["workload"].update(command=[sys.executable, str(LOOP)], args=[], standby=False, env=[], steps=steps)
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


async def finished(kube: Kube, cluster: FakeTpuCluster, what: str) -> dict[str, Any]:
    try:
        done = await eventually(
            lambda: status(kube).get("phase") in ("Succeeded", "Failed") and status(kube),
            timeout=STARTUP,
            what=what,
        )
    except AssertionError:
        print(*pod_logs(cluster), sep="\n")
        raise
    assert done["phase"] == "Succeeded", (done, cluster.log_of("tiny-lm-s0-w0")[-4000:])
    return done


def pod_logs(cluster: FakeTpuCluster) -> list[str]:
    """The end of every pod's log, for a failure's output."""
    return [f"--- {pod}:\n{cluster.log_of(pod)[-3000:]}" for pod in POD_NAMES]


async def no_pods_left(kube: Kube, cluster: FakeTpuCluster) -> None:
    await eventually(lambda: not kube.pods(NS), timeout=60, what="the job's pods deleted")
    await eventually(
        lambda: all(p.process.poll() is not None for p in cluster.running.values()),
        timeout=30,
        what="every pod process ended",
    )


async def test_a_suspended_job_resumes_from_its_persistent_step_and_a_recreated_one_loses_nothing(
    tmp_path: Path,
):
    async with (
        emulated_cluster() as kube,
        FakeTpuCluster(kube, tmp_path / "cluster", V5P_16_LABELS) as cluster,
        operator(kube),
    ):
        await cluster.add_pools({"pool-a": ["a-0", "a-1"], "pool-b": ["b-0", "b-1"]})
        await kube.apply(resumable_job(tmp_path, steps=SECOND))

        # Suspended once the first persistent step is committed and training went past it.
        try:
            await eventually(
                lambda: (
                    committed(tmp_path)[:1] == [PERSISTENT_INTERVAL]
                    and steps_ended(cluster) > PERSISTENT_INTERVAL + 2
                ),
                timeout=STARTUP,
                what=f"persistent step {PERSISTENT_INTERVAL} committed and training past it",
            )
        except AssertionError:
            print(f"persistent steps {committed(tmp_path)}, steps ended {steps_ended(cluster)}")
            print(f"status {status(kube)}", *pod_logs(cluster), sep="\n")
            raise
        await kube.patch_job(NS, "tiny-lm", {"spec": {"suspend": True}})
        await no_pods_left(kube, cluster)
        reached = steps_ended(cluster)  # the pods' logs: the status can be a publish (5 s) behind
        newest = committed(tmp_path)[-1]
        assert newest <= reached < SECOND, (newest, reached)

        # Resumed: the new pods' leader restores the newest persistent step, not step 0.
        await kube.patch_job(NS, "tiny-lm", {"spec": {"suspend": False}})
        done = await finished(kube, cluster, "the resumed job finished")
        assert done["step"] == SECOND
        assert done["lastRestore"] == {"generation": 0, "cause": "resume", "step": newest, "stepsReplayed": 0}
        assert done["paramsFingerprint"] == sdk_loop_fingerprint(SECOND)
        # Whichever host's supervisor won the job's Lease led the resumed run.
        logs = [cluster.log_of(pod) for pod in POD_NAMES]
        assert any(f"generation 0 starting from step {newest} of an earlier run" in log for log in logs)

        # A new run of the same TrainingJob (deleted, created again, longer) continues from SECOND.
        await kube.delete_job(NS, "tiny-lm")
        await no_pods_left(kube, cluster)
        # Gone once the operator let go of it (its finalizer): created again before, it is a 409.
        await eventually(lambda: not kube.emulator.live(TRAININGJOBS, NS), timeout=60, what="the job gone")
        await kube.apply(resumable_job(tmp_path, steps=LONGER))
        done = await finished(kube, cluster, "the re-created job finished")
        assert done["step"] == LONGER
        assert done["lastRestore"] == {"generation": 0, "cause": "resume", "step": SECOND, "stepsReplayed": 0}
        assert done["paramsFingerprint"] == sdk_loop_fingerprint(LONGER)
