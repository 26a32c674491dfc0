"""The whole cluster path on one machine: the real operator, the emulated API server, and pods run as
local processes by the fake scheduler and kubelet (tests/support/fake_kubelet.py).

A TrainingJob is applied and trains (JAX on CPU, one process per TPU host pod); a node is taken away
and the host is hot-swapped onto a spare node of its slice's pool; the next node loss leaves no
capacity, so after spec.health.replacementTimeoutSeconds the job scales down to one slice; a new
node brings the slice back (scale-up); deleting the job ends every process. A short job succeeds,
and so does the same job whose leader's pod is deleted mid-training, or whose leader's supervisor is
paused (SIGSTOP) until another host took the Lease over, then resumed: with the fault-free parameters,
and nothing written by the paused leader once it woke up. The short jobs train the SDK example's
model in lockstep (tests/fixtures/checkpointed_lockstep_loop.py), not JAX: their checks are about
the operator and the supervisors around a job, and its parameters after any number of restarts are
known in advance (`sdk_loop_fingerprint`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from slicekeeper.supervisor.leader.election import Holder

from slicekeeper import protocol
from tests.support.cli_runs import ROOT, sdk_loop_fingerprint
from tests.support.example_runs import DEVICES_PER_HOST
from tests.support.fake_kubelet import V5P_16_LABELS, FakeTpuCluster
from tests.support.operator_example import EXAMPLE, NS
from tests.support.operator_harness import Kube, emulated_cluster, eventually, operator
from tests.support.pod_events import steps_ended, workload_events
from tests.support.pod_launch import pod_processes
from tests.support.xla_flags import with_cheap_compile

pytestmark = [pytest.mark.asyncio, pytest.mark.slow, pytest.mark.heavy]

STARTUP = 180.0
"""Seconds for four JAX processes to start and compile on two shared cores."""

SHORT_STEPS = 150
"""Steps of the short job: long enough (about 9 s of training, 60 ms steps) for a disruption at
step 8 to find it still running, a maintenance notice's way through the operator included."""
SHORT_LOOP = ROOT / "tests" / "fixtures" / "checkpointed_lockstep_loop.py"
LEADER_POD = "tiny-lm-s0-w0"
"""Host 0's pod: its supervisor is the job's first leader."""
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/tiny-lm-leader"
FAULT_FREE = sdk_loop_fingerprint(SHORT_STEPS)
"""The parameters every short job must end with, whatever it went through."""


def training_job(tmp: Path, steps: int) -> dict[str, Any]:
    job = copy.deepcopy(EXAMPLE)
    job["metadata"]["namespace"] = NS
    spec = job["spec"]
    spec["workload"]["steps"] = steps
    spec["workload"]["env"] = [
        {"name": "JAX_PLATFORMS", "value": "cpu"},
        {
            "name": "XLA_FLAGS",
            "value": with_cheap_compile(f"--xla_force_host_platform_device_count={DEVICES_PER_HOST}"),
        },
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


def programs_in(cluster: FakeTpuCluster, generation: int) -> dict[str, tuple[list[str], list[str]]]:
    """Pod uid -> the programs its workload loaded and those it compiled in `generation` (its SDK
    `programs` event)."""
    return {
        pod.name: (record["loaded"], record["compiled"])
        for pod in (cluster.workdir / "pods").iterdir()
        for record in workload_events(cluster, pod.name)
        if record.get("type") == "programs" and record["generation"] == generation
    }


def first_programs_generation(cluster: FakeTpuCluster, pod_uid: str) -> int:
    """The first generation in which the pod `pod_uid`'s workload compiled or loaded its programs:
    the one that took it in (it may end no step there: under load a hang found in that generation's
    start once restarted it again before its first step)."""
    return min(int(r["generation"]) for r in workload_events(cluster, pod_uid) if r.get("type") == "programs")


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
        # Each slice on its own pool, one pod a node (which node of the pool: the order the pods
        # came in, which the operator's concurrent creation does not fix).
        assert {placed["tiny-lm-s0-w0"], placed["tiny-lm-s0-w1"]} == {"a-0", "a-1"}
        assert {placed["tiny-lm-s1-w0"], placed["tiny-lm-s1-w1"]} == {"b-0", "b-1"}

        # Host 3's node dies: host 3 is hot-swapped onto b-2, the spare node of its slice's pool.
        lost = placed["tiny-lm-s1-w1"]
        assert await cluster.lose_node(lost) == ["tiny-lm-s1-w1"]
        moved = await eventually(
            lambda: (
                (kube.pods(NS).get("tiny-lm-s1-w1") or {}).get("spec", {}).get("nodeName") == "b-2"
                and kube.pods(NS)["tiny-lm-s1-w1"]
            ),
            what="host 3's pod on b-2",
        )
        assert moved["metadata"]["annotations"]["slicekeeper.dev/avoid-nodes"] == lost
        new_pod = moved["metadata"]["uid"]
        await eventually(
            lambda: steps_ended(cluster, pod_uid=new_pod), timeout=STARTUP, what="the new pod's step"
        )
        step = await trains_past(kube, cluster, step)
        assert "HotSwap" in reasons(kube)
        assert status(kube)["restarts"]["host_lost"] >= 1 and status(kube)["restarts"]["replace"] == 1
        assert status(kube)["slicesActive"] == 2
        # The restart that took the replacement pod in (the first generation it loaded programs in:
        # on a loaded machine another restart, every pod loading, once came before the node was lost,
        # and once after, before the new pod's first step) loaded its programs from each surviving
        # pod's own volume; only the replacement pod, on a new node, compiled them. Which programs a
        # generation needs depends on its start: a step to restore (three), or none yet (`init`
        # too: on a loaded machine the node was once lost before any step was restorable).
        swap = first_programs_generation(cluster, new_pod)
        said = programs_in(cluster, swap)
        needed = {uid: frozenset(loaded + compiled) for uid, (loaded, compiled) in said.items()}
        assert len(said) == 4 and len(set(needed.values())) == 1 and len(needed[new_pod]) >= 3, (swap, said)
        assert said[new_pod][0] == [], (swap, said)  # it loaded none: it compiled every one it needed
        assert all(not compiled for uid, (_, compiled) in said.items() if uid != new_pod), (swap, said)

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


Disruption = Callable[[Kube, FakeTpuCluster], Awaitable[None]]
"""Something done to a running job once it trained past a step."""


async def short_job(
    tmp_path: Path,
    steps: int = SHORT_STEPS,
    *,
    disrupt: tuple[int, Disruption] | None = None,
    pools: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """The example job of `steps` steps run to its end on four pods; with `disrupt` (step, what), `what`
    is done once training passed `step` (a spare node stands by for a pod replaced meanwhile). Returns
    the final status."""
    job = training_job(tmp_path, steps=steps)
    job["spec"]["workload"].update(command=[sys.executable, str(SHORT_LOOP)], args=[], standby=False, env=[])
    async with (
        emulated_cluster() as kube,
        FakeTpuCluster(kube, tmp_path / "cluster", V5P_16_LABELS) as cluster,
        operator(kube),
    ):
        spare = ["a-2"] if disrupt is not None else []  # a node for host 0's new pod
        await cluster.add_pools(pools or {"pool-a": ["a-0", "a-1", *spare], "pool-b": ["b-0", "b-1"]})
        await kube.apply(job)
        if disrupt is not None:
            step, what = disrupt
            await eventually(lambda: steps_ended(cluster) > step, timeout=STARTUP, what=f"a step past {step}")
            await what(kube, cluster)
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


async def delete_the_leaders_pod(kube: Kube, cluster: FakeTpuCluster) -> None:
    await kube.delete_pod(NS, LEADER_POD)  # SIGTERM to its supervisor: the leader


async def lease_holder(kube: Kube) -> str:
    return (await kube.request("GET", LEASE_PATH))["spec"].get("holderIdentity") or ""


class PausedLeader:
    """Host 0's pod frozen (SIGSTOP to its supervisor and workload, as the cgroup freezer would: the
    other hosts' workloads wait in their collectives, so the job cannot end meanwhile) until another
    supervisor holds the job's Lease, and 2 s more while the new leader carries on; then thawed
    (SIGCONT). Records the API requests made from then on: whatever the old leader writes would be
    among them."""

    def __init__(self) -> None:
        self.paused_for: float | None = None
        self.holders: tuple[str, str] | None = None
        """The Lease's holder when host 0 was paused, and when it was resumed."""
        self.resumed_at_request: int | None = None
        self.kube: Kube | None = None

    async def __call__(self, kube: Kube, cluster: FakeTpuCluster) -> None:
        self.kube = kube
        # Frozen once its first view of the job has reached the API server, not while that first
        # write is under way (its client, made for it, takes a second or more here): a write sent
        # before the freeze lands after it, whatever the leader checks on waking.
        await eventually(lambda: self._status_writes(kube), what="the leader's first view written")
        [pod] = [p for p in cluster.running.values() if p.name == LEADER_POD and p.process.poll() is None]
        before = await lease_holder(kube)
        # The pod's command execs the supervisor; its workload may be between two of its processes
        # (a generation starting) at this moment on a loaded machine: frozen once one runs.
        try:
            frozen = await eventually(
                lambda: (lambda found: found if len(found) > 1 else None)(pod_processes(pod.process.pid)),
                what="host 0's workload running",
            )
        except AssertionError:  # say what the job was doing instead (a CI run of 97efc28 got here)
            print("steps ended:", steps_ended(cluster), "status:", status(kube))
            print("host 0's pod:", pod.process.poll(), pod_processes(pod.process.pid))
            print(cluster.log_of(LEADER_POD)[-6000:])
            raise
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            deadline = stopped + 60
            while (after := await lease_holder(kube)) in (before, "") and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await asyncio.sleep(2.0)
        finally:
            self.resumed_at_request = len(kube.emulator._requests)
            for pid in frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            self.paused_for = time.monotonic() - stopped
        self.holders = (before, after)

    def old_leaders_status_writes(self) -> list[dict[str, Any]]:
        """Views of the job published on host 0's pod by a leader of term 1 after it was resumed."""
        assert self.kube is not None and self.resumed_at_request is not None
        return self._status_writes(self.kube, since=self.resumed_at_request)

    @staticmethod
    def _status_writes(kube: Kube, since: int = 0) -> list[dict[str, Any]]:
        """Views of the job of a term up to 1 written on host 0's pod, from API request `since` on."""
        views = []
        for request in kube.emulator._requests[since:]:
            if request.method.value != "PATCH" or not request.url.path.endswith(f"/pods/{LEADER_POD}"):
                continue
            annotations = ((request.data or {}).get("metadata") or {}).get("annotations") or {}
            text = annotations.get(protocol.ANNOTATION_STATUS)
            if text and int(json.loads(text).get("term") or 0) <= 1:
                views.append(json.loads(text))
        return views


async def test_a_short_job_succeeds_in_pods(tmp_path: Path):
    done = await short_job(tmp_path)
    assert done["phase"] == "Succeeded", done
    assert done["step"] == SHORT_STEPS and done["lastCheckpointStep"] is not None
    assert 0 < done["goodput"] <= 1
    assert done["paramsFingerprint"] == FAULT_FREE  # every host's final parameters agree


async def test_the_leaders_pod_deleted_mid_training_hands_the_job_over_with_nothing_lost(tmp_path: Path):
    """The leader's supervisor stands down and releases the job's Lease as its pod is deleted; another
    host's supervisor takes the Lease at once, carries on the job's memory and treats host 0 as lost;
    the operator's new pod for host 0 joins and the job ends as the fault-free run does."""
    done = await short_job(tmp_path, disrupt=(8, delete_the_leaders_pod))
    assert done["phase"] == "Succeeded", done
    assert done["step"] == SHORT_STEPS
    assert done["restarts"].get("host_lost", 0) >= 1, done["restarts"]
    assert done["paramsFingerprint"] == FAULT_FREE


async def announce_maintenance_of_host_3(kube: Kube, cluster: FakeTpuCluster) -> None:
    """GKE's label on host 3's node: its VM goes for maintenance in two minutes."""
    node = kube.pods(NS)["tiny-lm-s1-w1"]["spec"]["nodeName"]
    labels = {"cloud.google.com/scheduled-maintenance-time": str(int(time.time()) + 120)}
    await kube.put_node({"metadata": {"name": node, "labels": labels}})


async def test_a_node_announced_for_maintenance_has_its_slice_handed_over_first_with_no_step_lost(
    tmp_path: Path,
):
    """The whole announced path in a cluster: the operator puts the notice on the pods of the slice
    whose node is labelled (a host event interrupts the whole TPU slice), their supervisors (watching
    their own pods) tell the leader, every host saves the same step and holds, hosts 2 and 3 are
    retired and the operator makes their new pods on the pool's spare nodes (never the announcing
    one), and the job restarts from the saved step: nothing trained again, the fault-free parameters."""
    pools = {"pool-a": ["a-0", "a-1"], "pool-b": ["b-0", "b-1", "b-2", "b-3"]}
    done = await short_job(tmp_path, disrupt=(8, announce_maintenance_of_host_3), pools=pools)
    leader_log = "".join(
        log.read_text() for log in (tmp_path / "cluster" / "pods").glob(f"*/{LEADER_POD}.log")
    )
    # What the leader said of the notices and what it did, for a failure's message (a run where host
    # 2 was never handed over left nothing else to go by).
    told = re.compile(r"announced|saving step|saved on every|generation \d+ starting|lost|replace|notice")
    story = "\n".join(line for line in leader_log.splitlines() if told.search(line))
    assert done["phase"] == "Succeeded", (done, story)
    assert done["step"] == SHORT_STEPS
    # Both hosts of slice 1 handed over (`replace` counts the operator's new pods), for one notice or
    # two (host 2's reaches the leader with the operator's next look at the job: in the same save, or
    # just after the restart); nothing was lost unannounced.
    assert done["restarts"].get("replace") == 2, (done["restarts"], story)
    assert set(done["restarts"]) == {"announced_loss", "replace"}, (done["restarts"], story)
    assert done["paramsFingerprint"] == FAULT_FREE
    saved = re.findall(r"step (\d+) saved on every host and replicated for host", leader_log)
    assert saved and f"generation 1 starting from step {saved[0]}" in leader_log
    assert "maintenance announced for host 3" in leader_log


async def test_a_paused_leader_is_replaced_and_once_resumed_writes_nothing(tmp_path: Path):
    """No split brain in a cluster: the leader's pod, frozen for longer than the Lease's duration,
    is replaced by another host's (the next term); resumed, it finds its last renewal older than the
    renew deadline and stands down without publishing its stale view of the job, and its host rejoins
    the new leader: while that gathers the members (the job goes on, no restart), or later, as a lost
    host whose replacement pod is then no longer awaited (none comes while the old pod lives; waiting
    for one scaled the job down: tests/unit/test_cluster_replacement.py). The job ends on both slices
    as the fault-free run does."""
    pause = PausedLeader()
    done = await short_job(tmp_path, disrupt=(8, pause))
    assert pause.holders is not None and pause.paused_for is not None, "never paused"
    before, after = pause.holders
    old, new = Holder.parse(before), Holder.parse(after)
    assert old is not None and old.host == 0, pause.holders
    assert new is not None and new.host != 0, pause.holders  # another host's supervisor leads
    assert done["phase"] == "Succeeded", done
    assert (done["step"], done["slicesActive"]) == (SHORT_STEPS, 2)
    assert done["paramsFingerprint"] == FAULT_FREE
    assert pause.old_leaders_status_writes() == []
    logs = [log.read_text() for log in (tmp_path / "cluster" / "pods").glob(f"*/{LEADER_POD}.log")]
    assert any("standing down as leader" in log for log in logs)  # woken up alive, and fenced
