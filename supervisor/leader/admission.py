"""Who joins the job's leader, and what the job does about it: the rules, as pure functions.

A supervisor registers before the first start (one of the hosts the start waits for), or after it: a
replacement pod, a member rejoining a new leader after its leader was lost (its workload in some
generation), or a supervisor started again on its machine (its workload died with the one before).
What each is told, and what the job does with the host it serves, depends on the job's phase and on
a few facts about the host; `leader.registrations` gathers those facts, asks here, and carries out the
answer's steps in order. Nothing here has a clock, a socket or asyncio, like the restart machine
(`leader.restart_machine`), whose phase it reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from slicekeeper.supervisor.leader.restart_state import JobState

from slicekeeper.policy.events import FaultKind

RESTARTED_JOB = frozenset({JobState.RUNNING, JobState.STOPPING})
"""Phases of a job that started: a member coming back is served again."""


class Joining(StrEnum):
    """What a registration says of itself."""

    HOST = "host"
    """A host's supervisor with no workload yet: before the start, or a new machine (pod) after it."""
    REJOINING = "rejoining"
    """A member whose leader was lost; its workload still in a generation."""
    RESTARTED = "restarted"
    """A host's supervisor started again on its machine; its workload died with the one before."""


class Admission(StrEnum):
    """The answer to a registration."""

    AWAITED = "awaited"
    """Before the first start: one of the hosts the start waits for."""
    LATE = "late"
    """After the start, a new machine: the capacity may take it over (a replacement); else it serves
    its host again, with no workload (`back`, `Joining.HOST`)."""
    REJOIN = "rejoin"
    """A member served again (`back`)."""
    RESTARTED = "restarted"
    """A restarted supervisor served again (`back`)."""
    TOO_LATE = "too_late"
    """The job succeeded: it is told to shut down."""
    REFUSED = "refused"
    """The job failed: it is told why."""


def admit(phase: JobState, joining: Joining) -> Admission:
    if phase in RESTARTED_JOB and joining is Joining.REJOINING:
        return Admission.REJOIN
    if phase in RESTARTED_JOB and joining is Joining.RESTARTED:
        return Admission.RESTARTED
    if phase is JobState.REGISTERING:
        return Admission.AWAITED
    if phase is JobState.SUCCEEDED:
        return Admission.TOO_LATE
    if phase is JobState.FAILED:
        return Admission.REFUSED
    return Admission.LATE


def all_registered(phase: JobState, registered: int, full_hosts: int) -> bool:
    """Whether a registration completed the hosts the first start waits for."""
    return phase is JobState.REGISTERING and registered == full_hosts


class HostState(StrEnum):
    """Where a host stands, as the leader sees it (the status lines and the TrainingJob status show it)."""

    REGISTERING = "registering"
    REGISTERED = "registered"
    STARTING = "starting"
    TRAINING = "training"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FINISHED = "finished"
    PARKED = "parked"
    """A host of a dropped slice, idle until the job scales back up."""
    LOST = "lost"
    AWAITING_REPLACEMENT = "awaiting replacement"


class Step(StrEnum):
    """What the leader does about a host served again, in the order `back` gives them."""

    STOP_AS_DROPPED = "stop_as_dropped"
    """Its workload, still in a generation, stops: its slice was dropped by a scale-down."""
    PARK = "park"
    """Its slice is not in the world: it waits as an idle host."""
    CAPACITY_RETURNED = "capacity_returned"
    """A host of a dropped slice is back: the policy may scale back up with it."""
    RECONSIDER = "reconsider"
    """The stopped job's start may wait for it no more: look again."""
    STOP_WITH_THE_REST = "stop_with_the_rest"
    """The job is stopping: it is told to stop too, for the stop's cause (`UNKNOWN_CAUSE` if none
    is recorded)."""
    STOP_AS_LOST = "stop_as_lost"
    """The running generation stops for a lost host: its workload is not in it (a new machine, a
    member taken for lost, or one rejoining from another generation)."""
    NO_WORKLOAD = "no_workload"
    """It has nothing to stop (a new machine): its stop counts as acknowledged."""
    CRASH = "crash"
    """Its workload died with its supervisor while the job ran: a crash of the host, decided on."""


UNKNOWN_CAUSE = {Joining.REJOINING: FaultKind.HOST_LOST, Joining.RESTARTED: FaultKind.CRASH}
"""The stop's cause told to a member back while the job stops, when no cause is recorded."""


@dataclass(frozen=True)
class Back:
    """The facts about a host served again after the start that the rules read."""

    joining: Joining
    takes_part: bool
    """Its slice is in the world (not dropped by a scale-down)."""
    idle: bool = False
    """It waited as an idle host before (parked): no capacity came back with it."""
    in_step: bool = True
    """Rejoining: its workload is in the running generation and it was not taken for lost."""


@dataclass(frozen=True)
class Answer:
    state: HostState | None
    """The host's state from now on (None: as it was)."""
    steps: tuple[Step, ...]


def back(phase: JobState, host: Back) -> Answer:
    """What the job does about a host served again after the start, in a job `phase` (RUNNING or
    STOPPING; for a new machine, any phase after the first start)."""
    stopping, running = phase is JobState.STOPPING, phase is JobState.RUNNING
    if not host.takes_part:
        if host.joining is Joining.HOST:
            parked, park = None, ()  # a new machine: it waits for the policy as it is
        else:
            dropped = (Step.STOP_AS_DROPPED,) if host.joining is Joining.REJOINING else ()
            parked, park = HostState.PARKED, (*dropped, Step.PARK)
        then = (Step.RECONSIDER,) if stopping else () if host.idle else (Step.CAPACITY_RETURNED,)
        return Answer(parked, (*park, *then))
    if host.joining is Joining.HOST:
        if stopping:
            return Answer(None, (Step.RECONSIDER,))
        return Answer(None, (Step.STOP_AS_LOST, Step.NO_WORKLOAD, Step.RECONSIDER) if running else ())
    if host.joining is Joining.RESTARTED:
        return Answer(HostState.STOPPING, (Step.STOP_WITH_THE_REST,) if stopping else (Step.CRASH,))
    state = HostState.TRAINING if running else HostState.STOPPING
    if stopping:
        return Answer(state, (Step.STOP_WITH_THE_REST,))
    return Answer(state, () if host.in_step else (Step.STOP_AS_LOST,))
