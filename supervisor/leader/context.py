"""What the leader's parts share, named once: a frozen `LeaderContext` handed to each part whole.

Every part of the leader (the restart machine's driver, remediation, announced losses, registrations,
a take-over) works on the same job's memory and world, talks to the same members, keeps the same
table of hosts, runs its background work the same way and writes the same journal. Handing them
those one by one made five constructors with the same dozen arguments; one value names them.
"""

from __future__ import annotations

from dataclasses import dataclass

from slicekeeper.supervisor.leader.background import BackgroundWork
from slicekeeper.supervisor.leader.capacity import Replacement
from slicekeeper.supervisor.leader.checkpoints import Checkpoints
from slicekeeper.supervisor.leader.decisions import Decisions
from slicekeeper.supervisor.leader.journal import JobMemory, JournalWriter
from slicekeeper.supervisor.leader.members import HostStatus, Members
from slicekeeper.supervisor.leader.world import JobWorld


@dataclass(frozen=True)
class LeaderContext:
    memory: JobMemory
    """The job's memory (leader.journal): what a leader that takes over carries on."""
    world: JobWorld
    """The job's slices, active and dropped."""
    members: Members
    """The connections to the hosts' supervisors."""
    status: dict[int, HostStatus]
    """What the leader knows of each host."""
    background: BackgroundWork
    """The one way the leader runs tasks and timers (fenced; a failure is the job's outcome)."""
    journal: JournalWriter
    """Writes the job's memory down on a few members."""
    checkpoints: Checkpoints
    """What every host and tier holds; the restore plan."""
    decisions: Decisions
    """The policy asked, its decisions recorded."""
    capacity: Replacement
    """Where a lost host's new machine comes from."""
