"""What the restart machine (leader.restart_machine) takes in and gives out, as frozen values.

Events come in from the driver (leader.generations) and from every part that reports to it; commands
go out to the driver, which carries each out through its applier (the journal, the members, the ack
deadline, a start, the job's end); requests go back to the sender of the event they answer
(`Generations.ask`: a lost host noted, an admission, a decision's steps). They live apart from the
transitions so that a reader finds the machine's vocabulary in one place and its rules in another.
"""

from __future__ import annotations

from dataclasses import dataclass

from slicekeeper.supervisor.leader import admission, remedies
from slicekeeper.supervisor.leader.restart_state import Readiness

from slicekeeper import policy
from slicekeeper.policy.events import FaultKind

# --- events -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultStop:
    """A fault of the running generation (or a stop the policy planned with nothing broken)."""

    host: int
    kind: FaultKind
    detail: str
    t: float
    """When it was detected."""
    live: frozenset[int]
    world: tuple[int, ...]
    planned: bool = False


@dataclass(frozen=True)
class AllRegistered:
    """Every host registered before the first start (or a stand-in made them complete)."""


@dataclass(frozen=True)
class StopAcked:
    """`hosts` acknowledged the stop of `generation` (read together: one event for many)."""

    hosts: frozenset[int]
    generation: int
    readiness: Readiness


@dataclass(frozen=True)
class NoWorkload:
    """`host` has nothing to stop: a new machine serving it, or a host of a slice coming back."""

    host: int


@dataclass(frozen=True)
class MemberLost:
    host: int


@dataclass(frozen=True)
class Reconsider:
    """Something the start waits for may have changed (a decision in, a member back)."""

    readiness: Readiness


@dataclass(frozen=True)
class AckDeadlinePassed:
    generation: int
    readiness: Readiness
    seconds: float


@dataclass(frozen=True)
class Started:
    """The driver started generation `generation` (restore plan chosen, members told)."""

    generation: int


@dataclass(frozen=True)
class StartAbandoned:
    """The driver could not start yet (a host lost while the persistent tier was read): the next
    registration or decision starts it."""


@dataclass(frozen=True)
class StartChecked:
    """What a commanded start found (the driver read the persistent tier before the first start):
    `missing`, the active hosts with no machine; `unreadable`, why the persistent tier cannot be
    read (None: it can, or it was not needed)."""

    missing: tuple[int, ...] = ()
    unreadable: str | None = None


@dataclass(frozen=True)
class Hold:
    """`why` holds the next start until it is released (as often as held)."""

    why: str


@dataclass(frozen=True)
class Release:
    why: str


@dataclass(frozen=True)
class Progressed:
    """A step of the running generation completed."""


@dataclass(frozen=True)
class HostFinished:
    host: int
    generation: int
    world: tuple[int, ...]


@dataclass(frozen=True)
class JobFails:
    reason: str


@dataclass(frozen=True)
class TookOver:
    """A new leader carries on the job's memory, `members` registered with it: a stop that was under
    way (its cause `kind`, from the journal) is sent to each of them again, and each acks it again
    with what it holds."""

    kind: FaultKind | None
    members: tuple[int, ...]


@dataclass(frozen=True)
class HostLost:
    """A member's connection dropped while its host takes part: its machine is gone, with its local
    tier and replicas. Running: a fault, stopped like any, then decided on; stopping: decided on;
    before the first start: a new machine must stand in."""

    host: int
    detail: str
    t: float
    live: frozenset[int]
    world: tuple[int, ...]


@dataclass(frozen=True)
class Joins:
    """A supervisor registers, saying what it is: answered by how it is admitted (`Admit`)."""

    joining: admission.Joining


@dataclass(frozen=True)
class Registered:
    """A host's supervisor with no workload was served: `members` hosts are served now, of the
    `full_hosts` the first start waits for; `back`: the facts about it, should the job have started."""

    members: int
    full_hosts: int
    back: admission.Back


@dataclass(frozen=True)
class Returns:
    """A member served again after the start (rejoining, restarted, a new machine taken as itself):
    answered by what the job does about it (`ServeAgain`)."""

    back: admission.Back


@dataclass(frozen=True)
class Decided:
    """The policy answered `event` with `action`: answered by the steps that carry it out (`Carry`)."""

    event: policy.Event
    action: policy.Action


@dataclass(frozen=True)
class CapacityOffered:
    """Machines joined while the job may run scaled down: answered by `OfferCapacity` once the job
    trains (it progressed, and no decision is under way)."""


Event = (
    AllRegistered
    | FaultStop
    | StopAcked
    | NoWorkload
    | MemberLost
    | Reconsider
    | AckDeadlinePassed
    | Started
    | StartAbandoned
    | StartChecked
    | Hold
    | Release
    | Progressed
    | HostFinished
    | JobFails
    | TookOver
    | HostLost
    | Joins
    | Registered
    | Returns
    | Decided
    | CapacityOffered
)


# --- commands -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordStop:
    """Write the stop into the job's memory (its cause, the detection, the faults it detects)."""

    host: int
    kind: FaultKind
    detail: str
    planned: bool
    refused: bool
    generation: int
    t: float


@dataclass(frozen=True)
class WriteJournal:
    pass


@dataclass(frozen=True)
class SendStop:
    generation: int
    kind: FaultKind
    host: int | None
    to: tuple[int, ...]


@dataclass(frozen=True)
class ArmAckDeadline:
    generation: int


@dataclass(frozen=True)
class CancelAckDeadline:
    pass


@dataclass(frozen=True)
class StartGeneration:
    """Find out whether the next generation can start (the persistent tier read before the first
    start, every active host with a machine): answered by `StartChecked`. `first`: the job's first
    start (nothing ran yet)."""

    first: bool


@dataclass(frozen=True)
class LaunchGeneration:
    """Generation `generation` runs: choose the restore plan, record the recovery, write the journal,
    tell each member to start (or park). `first`: the job's first start."""

    generation: int
    first: bool


@dataclass(frozen=True)
class EndJob:
    """The job is over (`succeeded`, else failed with `reason`): summary, event, journal, tell every
    member, release the spares, wake whoever awaits the end."""

    succeeded: bool
    reason: str | None = None


Command = (
    RecordStop
    | WriteJournal
    | SendStop
    | ArmAckDeadline
    | CancelAckDeadline
    | StartGeneration
    | LaunchGeneration
    | EndJob
)


# --- requests: commands the sender of an event carries out (Generations.ask) -----------------------


@dataclass(frozen=True)
class NoteLoss:
    """Say the lost host was found (the job was not running: no stop records it)."""

    host: int
    detail: str


@dataclass(frozen=True)
class StandIn:
    """Before the first start: a new machine must stand in for the lost host, or the job cannot start."""

    host: int


@dataclass(frozen=True)
class DecideOnLoss:
    """Ask the policy what to do about the lost host."""

    host: int


@dataclass(frozen=True)
class Admit:
    admission: admission.Admission


@dataclass(frozen=True)
class ServeAgain:
    """What the job does about a host served again (leader.admission.back)."""

    answer: admission.Answer


@dataclass(frozen=True)
class Carry:
    """The steps that carry out a decision, in order (leader.remedies)."""

    intents: tuple[remedies.Intent, ...]


@dataclass(frozen=True)
class OfferCapacity:
    """Offer the machines that joined to the policy now."""


Request = NoteLoss | StandIn | DecideOnLoss | Admit | ServeAgain | Carry | OfferCapacity
"""Commands addressed to the sender of the event rather than to the driver."""
