"""A leader's parts the job's metrics read (memory, world, decisions), built without a leader."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from slicekeeper.supervisor.leader.background import Task
from slicekeeper.supervisor.leader.decisions import Decisions
from slicekeeper.supervisor.leader.journal import JobMemory
from slicekeeper.supervisor.leader.members import HostStatus
from slicekeeper.supervisor.leader.world import JobWorld
from slicekeeper.supervisor.signals.straggler import StragglerDetector

from slicekeeper.policy.engine import PolicyEngine
from slicekeeper.shape import JobShape


@dataclass
class LeaderView:
    memory: JobMemory
    world: JobWorld
    decisions: Decisions
    status: dict[int, HostStatus]
    """Each host's, as the leader keeps them (a straggler's record names its machine)."""
    task_failures: Counter[Task] = field(default_factory=Counter)


def leader_view(
    slices: int = 2, hosts_per_slice: int = 2, detector: StragglerDetector | None = None
) -> LeaderView:
    """A fresh job of `slices` x `hosts_per_slice` hosts, its straggler windows started."""
    world = JobWorld(JobShape(slices=slices, hosts_per_slice=hosts_per_slice))
    status = {host: HostStatus() for host in range(world.full_hosts)}
    decisions = Decisions(PolicyEngine(None), world, detector=detector, status=status)
    decisions.new_world()
    return LeaderView(JobMemory(started_at=0.0), world, decisions, status)
