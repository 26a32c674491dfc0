"""The job as others see it: the watchers' status lines, the TrainingJob status, the job summary.

Pure views of the leader's state (the job's memory, the world, what the leader knows of each host,
the decisions): computed on demand, never stored, so they cannot drift from what they show.
"""

from __future__ import annotations

import time
from typing import Any

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader.decisions import Decisions
from slicekeeper.supervisor.leader.journal import JobMemory
from slicekeeper.supervisor.leader.members import HostStatus
from slicekeeper.supervisor.leader.world import JobWorld

from slicekeeper.leader_view import LastRestore
from slicekeeper.leader_view import LeaderView as LeaderView  # what Leader.cluster_status returns


def status_line(memory: JobMemory, status: dict[int, HostStatus]) -> messages.Status:
    """What a watcher (the local runtime's display) shows, every half second."""
    hosts = []
    for host, known in status.items():
        seen = known.steps_seen
        rate = (
            (seen[-1][1] - seen[0][1]) / (seen[-1][0] - seen[0][0])
            if len(seen) > 1 and seen[-1][0] > seen[0][0]
            else None
        )
        hosts.append(
            messages.HostView(
                host=host,
                state=known.state,
                step=known.step,
                loss=known.loss,
                steps_per_second=rate,
                metrics_port=known.metrics_port,
                machine=known.machine,
            )
        )
    return messages.Status(
        t=time.time(),
        state=memory.state.value,
        generation=memory.generation,
        restarts=dict(memory.restarts),
        hosts=hosts,
    )


def cluster_status(
    memory: JobMemory,
    world: JobWorld,
    checkpoint_step: int | None,
    awaiting: list[int],
    *,
    term: int,
    params_fingerprint: str | None,
) -> LeaderView:
    """The job as the TrainingJob's status shows it (published on the leader's pod in a cluster);
    `checkpoint_step`: the newest step every shard restores from; `term`: the leader's;
    `params_fingerprint`: the final parameters' digest every host agreed on, once the job succeeded."""
    return LeaderView(
        state=memory.state.value,
        generation=memory.generation,
        step=memory.high_water,
        slicesActive=len(world.active),
        restarts=dict(memory.restarts),
        hotSwaps=len(memory.hot_swaps),
        lastCheckpointStep=checkpoint_step,
        lastRestore=_last_restore(memory),
        awaitingReplacement=awaiting,
        failureReason=memory.failure_reason,
        term=term,
        paramsFingerprint=params_fingerprint,
    )


def _last_restore(memory: JobMemory) -> LastRestore | None:
    if not memory.recoveries:
        return None
    last = memory.recoveries[-1]
    return LastRestore(
        generation=last["generation"],
        cause=last["cause"],
        step=last["restore_step"],
        stepsReplayed=last["steps_replayed"],
    )


def summary(
    memory: JobMemory,
    world: JobWorld,
    status: dict[int, HostStatus],
    decisions: Decisions,
    fingerprints: dict[int, str | None],
) -> dict[str, Any]:
    """The job summary (`job-summary.json`) the run report is made from."""
    return {
        "state": memory.state.value,
        "failure_reason": memory.failure_reason,
        "generations": memory.generation + 1,
        "restarts": dict(memory.restarts),
        "faults": [vars(f) for f in memory.faults],
        "detections": [vars(d) for d in memory.detections],
        "fingerprints": fingerprints,
        "steps_completed": memory.high_water,
        "metrics_ports": {h: s.metrics_port for h, s in status.items()},
        "restores": memory.restores,
        "recoveries": memory.recoveries,
        "hot_swaps": memory.hot_swaps,
        "leader_changes": memory.leader_changes,
        "persistent_committed": sorted(memory.persistent_committed),
        "persistent_commits": memory.persistent_commits,
        "failed_saves": dict(memory.failed_saves),
        "machines": {h: s.machine for h, s in status.items()},
        "decisions": decisions.records,
        "stragglers": decisions.stragglers,
        "world": world.history,
        "scale_events": decisions.scale_events,
    }
