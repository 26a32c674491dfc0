"""What the leader's parts share, named once: a frozen `LeaderContext` handed to each part whole.

Every part of the leader (the restart machine's driver, remediation, announced losses, registrations,
a take-over) works on the same job's memory and world, talks to the same members, keeps the same
table of hosts, runs its background work the same way and writes the same journal. Handing them
those one by one made five constructors with the same dozen arguments; one value names them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTier
from slicekeeper.supervisor.leader.background import BackgroundWork
from slicekeeper.supervisor.leader.capacity import LeaderParts, Replacement, Replacements
from slicekeeper.supervisor.leader.checkpoints import Checkpoints
from slicekeeper.supervisor.leader.decisions import Decisions
from slicekeeper.supervisor.leader.job_journal import JobJournal
from slicekeeper.supervisor.leader.journal import JobMemory, JournalWriter
from slicekeeper.supervisor.leader.members import HostStatus, Members
from slicekeeper.supervisor.leader.settings import LeaderSettings
from slicekeeper.supervisor.leader.world import JobWorld

from slicekeeper.policy.engine import PolicyEngine


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

    @classmethod
    def of_job(
        cls,
        settings: LeaderSettings,
        background: BackgroundWork,
        *,
        persistent: PersistentTier | None,
        engine: PolicyEngine,
        replacements: Replacements,
        term: int,
    ) -> tuple[LeaderContext, JobJournal]:
        """A new leader's parts for the job `settings` describe, with nothing known yet (a leader
        taking over carries its predecessor's journal on afterwards), and the job's journal, which
        reads and carries on the job's memory as JSON."""
        shape = settings.shape
        memory = JobMemory(started_at=time.time())
        world = JobWorld(shape, settings.min_slices)
        members = Members(settings.log_events, term=term, leading=background.leading)
        status = {h: HostStatus() for h in range(shape.host_count)}
        decisions = Decisions(
            engine, world, events_path=settings.events_path, leading=background.leading, status=status
        )
        job_journal = JobJournal(memory, world, decisions)
        journal = JournalWriter(members, job_journal.state, shape.slice_of)
        checkpoints = Checkpoints(
            memory, status, world, members, persistent, settings.persistent_keep, journal.write
        )
        capacity = replacements(LeaderParts(members, status, memory, journal, background, background.inbox))
        context = cls(memory, world, members, status, background, journal, checkpoints, decisions, capacity)
        return context, job_journal
