"""What a job's supervisors say to each other: every leader <-> member message, typed, in one place.

The wire is JSON lines (`slicekeeper.protocol.encode`), one object per message, told apart by its
`type`. Here each message is a pydantic model with the fields it carries, and `decode` turns a line
into the right one (or raises `ValueError` naming the message and the field that is wrong), so the
leader and the members never index a dict by a string that may be missing.

Three directions:
- member -> leader (`MemberReport`): what a host's supervisor reports (registering, progress,
  checkpoints, faults, stop acknowledgements, ...); each carries `host` and the time `t` it was said.
  The parts of a host's supervisor build a report without its host: the supervisor stamps the host
  it serves when it sends the report (a spare takes a host over), as the leader stamps its term;
- leader -> member (`Command`): what the leader tells its members (start, stop, park, retire, ...),
  and the journal it writes down on them before a command (supervisor.leader.journal);
- watcher <-> leader: a watcher (the local runtime's progress display) asks to `watch` and receives
  `status` and `event` lines.
Fields the receiver does not know are ignored, so a newer member can talk to an older leader.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    model_validator,
)
from slicekeeper.supervisor.checkpoint_vocabulary import RestoreSource

from slicekeeper import protocol
from slicekeeper.chaos import ChaosKind
from slicekeeper.policy.events import FaultKind
from slicekeeper.shape import host_ranges, parse_host_ranges


def _as_runs(value: Any) -> Any:
    return host_ranges(value) if isinstance(value, (list, tuple)) else value


HostRuns = Annotated[str, BeforeValidator(_as_runs)]
"""Hosts in order, as runs of consecutive numbers ("0-24999", slicekeeper.shape.host_ranges): a list
of hosts given is written so. A start tells every host the world: made once, not once per host."""


UNSTAMPED = -1
"""The host of a report not sent yet: its supervisor stamps the host it serves (a spare has none)."""


class Message(BaseModel):
    """One line of the supervisors' protocol."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    def encode(self) -> bytes:
        return protocol.encode(self.model_dump(mode="json"))


# --- member -> leader ---------------------------------------------------------------------------
class Report(Message):
    """Said by the supervisor of `host`, at `t` (its clock). A report on the wire names its host
    (`to_leader` refuses one that does not); `UNSTAMPED` until its supervisor sends it."""

    host: int = UNSTAMPED
    t: float = Field(default_factory=time.time)


class Register(Report):
    """A host's supervisor joins the job (a pod's replacement too, after the job started)."""

    type: Literal["register"] = "register"
    machine: str = ""
    metrics_port: int | None = None
    replica_address: str | None = None
    pid: int | None = None
    journal: Journal | None = None
    """Rejoining after its leader was lost: the newest journal this member holds (a new leader carries
    on the newest any member holds)."""
    generation: int | None = None
    """Rejoining: the generation this host is in."""
    step: int | None = None
    """Rejoining: the furthest step this host completed (the journal is not written at every step)."""
    parked: bool = False
    """Rejoining: this host idles in a slice a scale-down dropped (it was no capacity lost)."""
    restarted: bool = False
    """A supervisor started again on the same machine (the one before it died, and its workload with
    it; the machine's disk, its checkpoints included, is intact)."""


class StateReport(Report):
    type: Literal["state"] = "state"
    state: str


class Progress(Report):
    """A step ended on the host; `work`: the seconds of its own work in it (straggler detection).
    `earlier`: the steps the host completed since its previous report, before this one, each as
    (step, when it ended, work): a host of a large job reports every `Start.progress_every` steps."""

    type: Literal["progress"] = "progress"
    generation: int
    step: int
    loss: float | None = None
    work: float | None = None
    core: int | None = None
    """Local mode: the CPU core the host's own work runs on (protocol.ENV_OWN_WORK_CORE); the leader
    compares a host's work with that of the hosts sharing its core (supervisor.signals.straggler)."""
    earlier: list[tuple[int, float, float | None]] = []


class Committed(Report):
    """The host's local tier committed its shard of `step`."""

    type: Literal["checkpoint"] = "checkpoint"
    step: int


class CheckpointInvalid(Report):
    """A copy of the host's shard of `step` in `tier` failed (`reason`) or proved corrupt; `any`:
    every source of it failed at a restore."""

    type: Literal["checkpoint_invalid"] = "checkpoint_invalid"
    step: int
    tier: str = "local"
    reason: str | None = None
    detail: str = ""


class Persisted(Report):
    """The host's shard of `step` is uploaded to the persistent tier (committed once all are)."""

    type: Literal["persisted"] = "persisted"
    step: int


class Restored(Report):
    """The supervisor staged the host's shard of `step` from `tier` (a peer: `holder`)."""

    type: Literal["restored"] = "restored"
    step: int
    tier: str
    holder: int | None = None
    seconds: float | None = None
    bytes: int | None = None


class Loaded(Report):
    """The workload says which step it restored (checked against what was staged)."""

    type: Literal["loaded"] = "loaded"
    generation: int
    step: int


class ChaosFired(Report):
    """A chaos fault aimed at the host fired (`fault`: its spec, which never fires again)."""

    type: Literal["chaos"] = "chaos"
    kind: ChaosKind
    step: int
    fault: str = ""
    generation: int = -1
    disruptive: bool = True
    detail: str = ""


class Notice(Report):
    """The host's machine will go at `at` (Unix seconds): `cause` "maintenance" or "preemption",
    `source` the signal read (a chaos fault, SIGTERM, the pod's notice annotation)."""

    type: Literal["notice"] = "notice"
    cause: Literal["maintenance", "preemption"]
    at: float
    source: str = ""


class Replicated(Report):
    """The host's shard of `step`, saved on a notice of its machine's loss, reached its peers."""

    type: Literal["replicated"] = "replicated"
    step: int


class Fault(Report):
    """The host's workload failed: crashed, hung, restore failed, a non-finite loss after a restore."""

    type: Literal["fault"] = "fault"
    generation: int
    kind: FaultKind
    detail: str = ""
    exit_code: int | None = None
    signal: str | None = None
    silent_seconds: float | None = None
    invalid_step: int | None = None
    """The restored step proved bad: no tier may restore it again."""


class ActivityReport(Report):
    """Where the host's workload is (supervisor.signals.culprit.Activity), asked at a hang report."""

    type: Literal["activity"] = "activity"
    generation: int
    step: int
    stage: str
    phase: str
    silent_seconds: float
    process: str = "running"
    """The workload's process: running, stopped or gone (supervisor.signals.culprit.process_state)."""


class Stopped(Report):
    """The host's workload is stopped; what its disk holds now (read with the workload dead)."""

    type: Literal["stopped"] = "stopped"
    generation: int
    committed: list[int] | None = None
    replicas: dict[int, list[int]] | None = None
    """owner -> steps of the owner's shard this host keeps as peer replicas."""


class Finished(Report):
    type: Literal["finished"] = "finished"
    generation: int
    step: int
    fingerprint: str | None = None


class RegisterSpare(Message):
    """An idle spare supervisor offers itself (`chaos`: the fault spec that brought it, if any)."""

    type: Literal["register_spare"] = "register_spare"
    spare: int
    machine: str = ""
    metrics_port: int | None = None
    replica_address: str | None = None
    pid: int | None = None
    chaos: str | None = None


class Watch(Message):
    """A watcher asks for the job's status and events."""

    type: Literal["watch"] = "watch"


class RelayHello(Message):
    """The first line of a relay's connection: what follows are its group's members' lines, framed
    (supervisor.relay_frames)."""

    type: Literal["relay"] = "relay"
    group: int
    host: int | None = None
    """The host whose supervisor relays (None: none of the job's, as in the control-plane benchmark):
    when the relay's connection ends, that host is lost with it at once."""


# --- member -> relay ----------------------------------------------------------------------------
class RelayTo(Message):
    """The first line of a member's connection to its group's relay: the leader to carry it to (the
    one the job's lease names); every later line is the member's to that leader."""

    type: Literal["relay_to"] = "relay_to"
    leader: str


class LeaderGone(Message):
    """Said by a relay to each member it carried to a leader whose connection ended: the member's
    connection to the relay stays open, and the member, once it found the next leader, says so on it
    (RelayTo again) instead of connecting and handshaking anew (a hand-over of relays, not of hosts)."""

    type: Literal["leader_gone"] = "leader_gone"


LEADER_GONE = LeaderGone().encode()
"""LeaderGone's line, as a relay writes it and a member recognizes it."""


class WhoLeads(Message):
    """The first line of a connection to a supervisor's relay port asking whom the job's lease names
    (a supervisor that does not read the lease itself: supervisor.host.leadership); answered with
    one LeaseSeen, then the connection ends."""

    type: Literal["who_leads"] = "who_leads"


class LeaseSeen(Message):
    """The job's lease as the answering supervisor last read it (`holder`: its holder's identity,
    prefixed when released, as the Lease records it; None: no lease read yet)."""

    type: Literal["lease_seen"] = "lease_seen"
    holder: str | None = None
    term: int = 0
    renewed_at: float = 0.0


# --- leader -> member ---------------------------------------------------------------------------
class Order(Message):
    """Said by the leader of `term` (supervisor.leader.election): a member ignores what a leader of an
    older term says than the newest it has seen (fencing)."""

    term: int = 0


class Journal(Order):
    """The job's memory, written down on a member before the command it leads to; a member keeps the
    one with the highest `seq`. Written whole (`journal`), or as the `change` from journal `base`
    (supervisor.leader.journal_delta), which the member holds."""

    type: Literal["journal"] = "journal"
    seq: int
    journal: dict[str, Any] = {}
    base: int | None = None
    change: list[list[Any]] | None = None

    @model_validator(mode="after")
    def _whole_or_change(self) -> Journal:
        if (self.change is None) != (self.base is None):
            raise ValueError("a journal change names the journal it changes (base), and only then")
        if self.change is not None and self.journal:
            raise ValueError("a journal is written whole or as a change, not both")
        return self


class Stop(Order):
    """Kill the workload and ack with `stopped`; `host`: whose fault it is (a planned stop: None)."""

    type: Literal["stop"] = "stop"
    generation: int
    kind: FaultKind
    host: int | None = None


class Start(Order):
    """Start generation `generation` as rank `rank` of `world`, from `restore_step` (staged from
    `sources`, in order of preference)."""

    type: Literal["start"] = "start"
    generation: int
    coordinator: str
    restore_step: int | None
    sources: list[RestoreSource] = []
    replica_addresses: dict[int, str] = {}
    """The addresses of the hosts that keep this host's replicas (supervisor.checkpoints.peer_tier)."""
    world: HostRuns
    """The hosts taking part, in rank order (`hosts`)."""
    rank: int
    progress_every: int = 1
    """Report progress every this many steps (the first step of the generation always; the host's
    rank spreads the others over the steps): what the leader takes in stays the same at any size."""

    @property
    def hosts(self) -> list[int]:
        """The world, as a list of hosts in rank order."""
        return parse_host_ranges(self.world)


class Park(Order):
    """This host's slice was dropped: idle, its steps after `restore_step` dropped."""

    type: Literal["park"] = "park"
    generation: int
    restore_step: int | None = None


class Retire(Order):
    """This live machine leaves the job (replaced)."""

    type: Literal["retire"] = "retire"
    generation: int
    reason: str = ""


class Assign(Order):
    """To a spare: take over `host` (`fired`: its chaos faults that already fired)."""

    type: Literal["assign"] = "assign"
    host: int
    generation: int
    fired: list[str] = []


class Shutdown(Order):
    """The job succeeded (or does not need this spare): end."""

    type: Literal["shutdown"] = "shutdown"


class Failed(Order):
    """The job failed: end."""

    type: Literal["fail"] = "fail"
    reason: str


class SaveAt(Order):
    """A notice came: save `step` of generation `generation` (every host the same step), then hold
    until stopped, training no step that the restart would only train again."""

    type: Literal["save_at"] = "save_at"
    generation: int
    step: int
    noticed: int
    """The host whose machine goes: it says when its shard of `step` reached its peers (Replicated)."""
    until: float
    """When that machine goes (Unix seconds): no use waiting for the save past it."""


class ActivityRequest(Order):
    """Say where your workload is (a hang was reported)."""

    type: Literal["activity_request"] = "activity_request"
    generation: int


# --- leader -> watcher --------------------------------------------------------------------------
class HostView(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    host: int
    state: str
    step: int
    loss: float | None = None
    steps_per_second: float | None = None
    metrics_port: int | None = None
    machine: str = ""
    """The machine serving the host (`host-1`, or the spare that took it over); "" before it registered."""


class Status(Message):
    type: Literal["status"] = "status"
    t: float
    state: str
    generation: int
    restarts: dict[str, int]
    hosts: list[HostView]


class EventNote(Message):
    """Something the job went through, in words (`host`, `kind`, `generation`: what it concerns)."""

    type: Literal["event"] = "event"
    t: float
    text: str
    host: int | None = None
    kind: str | None = None
    generation: int | None = None
    metrics_port: int | None = None


MemberReport = (
    Register
    | StateReport
    | Progress
    | Committed
    | CheckpointInvalid
    | Persisted
    | Restored
    | Loaded
    | ChaosFired
    | Notice
    | Replicated
    | Fault
    | ActivityReport
    | Stopped
    | Finished
)
ToLeader = MemberReport | RegisterSpare | Watch
Command = Journal | Stop | Start | Park | Retire | Assign | Shutdown | Failed | ActivityRequest | SaveAt
ToWatcher = Status | EventNote

_TO_LEADER: TypeAdapter[ToLeader] = TypeAdapter(Annotated[ToLeader, Field(discriminator="type")])
_COMMAND: TypeAdapter[Command] = TypeAdapter(Annotated[Command, Field(discriminator="type")])
_TO_WATCHER: TypeAdapter[ToWatcher] = TypeAdapter(Annotated[ToWatcher, Field(discriminator="type")])


def to_leader(line: bytes | str) -> ToLeader:
    """A line a member or watcher sent the leader. ValueError (pydantic's, naming the message type
    and the field) for a line that is not one, or a report that names no host."""
    return to_leader_value(protocol.decode(line))


def to_leader_value(value: Any) -> ToLeader:
    """A member's line, read already (a relay's gathered acknowledgements: supervisor.relay_frames),
    as `to_leader` reads it."""
    message = _TO_LEADER.validate_python(value)
    if isinstance(message, Report) and "host" not in message.model_fields_set:
        raise ValueError(f"a {message.type} report that names no host")
    return message


def relay_hello(line: bytes | str) -> RelayHello | None:
    """The relay's greeting, when `line` is one (None: any other line, a member's first)."""
    try:
        value = protocol.decode(line)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("type") != "relay":
        return None
    return RelayHello.model_validate(value)


def relay_to(line: bytes | str) -> RelayTo | WhoLeads:
    """The first line a member sent its relay, or a question of whom the lease names."""
    value = protocol.decode(line)
    if isinstance(value, dict) and value.get("type") == "who_leads":
        return WhoLeads.model_validate(value)
    return RelayTo.model_validate(value)


def lease_seen(line: bytes | str) -> LeaseSeen:
    """A relay port's answer to WhoLeads."""
    return LeaseSeen.model_validate(protocol.decode(line))


def command(line: bytes | str) -> Command:
    """A line the leader sent a member."""
    return _COMMAND.validate_python(protocol.decode(line))


def to_watcher(line: bytes | str) -> ToWatcher:
    """A line the leader sent a watcher."""
    return _TO_WATCHER.validate_python(protocol.decode(line))
