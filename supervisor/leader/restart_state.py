"""The restart state machine's state: the job's phase and what its transitions read.

One value (`RestartState`) in the job's memory, written by the machine's driver alone
(leader.generations) and read by the rules that answer from it: the restart machine's transitions
(leader.restart_machine), the admission of a registering supervisor (leader.admission) and what a
policy's decision comes to (leader.remedies). Kept apart so those rules can be called from the
transitions without an import loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

DECIDING = "a decision under way"
WAITING = "a policy's Wait"
CARRYING_ON = "carrying on a lost leader's journal"
"""What may hold the next start (`RestartState.holds`): a policy decision being taken or applied, a
policy's `Wait`, a new leader carrying on its predecessor's journal."""


class JobState(StrEnum):
    REGISTERING = "registering"
    RUNNING = "running"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


END_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED})


@dataclass(frozen=True)
class RestartState:
    """What the restart state machine knows; the rest of the job's memory is the driver's."""

    phase: JobState = JobState.REGISTERING
    generation: int = 0
    stopped: frozenset[int] = frozenset()
    """Members that acked the stop of this generation (or have no workload to stop)."""
    finished: frozenset[int] = frozenset()
    """Members that finished training in this generation."""
    progressed: bool = False
    """The running generation completed a step."""
    restarts: int = 0
    """Stops that restarted the job (spec.health.maxRestarts counts them)."""
    restarts_without_progress: int = 0
    """Consecutive starts that never completed a step."""
    ack_deadline: bool = False
    """The deadline for stop acknowledgements is armed."""
    starting: bool = False
    """A start was commanded and has not been reported as started (or given up) yet."""
    failure_reason: str | None = None
    holds: tuple[str, ...] = ()
    """What holds the next start, one entry per hold (`Hold`, `Release`): a decision under way, a
    policy's `Wait`, a leader carrying on a journal. No start while any is held."""

    @property
    def over(self) -> bool:
        return self.phase in END_STATES

    def held(self, why: str) -> bool:
        return why in self.holds

    def runs(self, generation: int) -> bool:
        """`generation` is the one training now: only its faults, steps and ends count (one stop per
        generation; a report of a generation being torn down is late)."""
        return self.phase is JobState.RUNNING and generation == self.generation

    @property
    def stopping(self) -> bool:
        """A generation is being stopped: the next one starts once every member stopped its workload."""
        return self.phase is JobState.STOPPING

    def stops(self, generation: int) -> bool:
        """`generation` is the one being stopped: only its acknowledgements count."""
        return self.stopping and generation == self.generation


@dataclass(frozen=True)
class Readiness:
    """The facts the start condition depends on, as the leader sees them now."""

    live: frozenset[int]
    """Hosts whose supervisor is connected."""
    world: tuple[int, ...]
    """Hosts of the active slices: the ones the next generation runs on."""
    holding: bool = False
    """A decision under way, a policy's `Wait`, a replacement on its way: no start yet."""
