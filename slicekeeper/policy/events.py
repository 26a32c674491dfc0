"""The events a policy decides on: faults of a host, a slow host, capacity coming back.

Part of the policy API; users import these names from slicekeeper.policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, ClassVar

from slicekeeper.policy.codec import fields_from_json, fields_to_json, mapping


class EventKind(StrEnum):
    CRASH = "crash"
    """The workload process of a host exited or was killed."""
    HANG = "hang"
    """A host's workload stopped making progress (alive, no step within the hang timeout)."""
    HOST_LOST = "host_lost"
    """A whole machine is gone (its supervisor, workload and local disk)."""
    STRAGGLER = "straggler"
    """A host is persistently slower than its peers."""
    CHECKPOINT_INVALID = "checkpoint_invalid"
    """A restored checkpoint proved bad, or no valid copy of a host's shard was found."""
    CAPACITY_RETURNED = "capacity_returned"
    """Spare machines became available while the job runs on fewer slices than its spec."""
    ANNOUNCED_LOSS = "announced_loss"
    """A host's machine will go soon, and said so: maintenance ahead, or a preemption's grace."""


class FaultKind(StrEnum):
    """What stopped a job's running generation: the one vocabulary of a host's fault report and the
    leader's stop on the wire, the job's memory and report (`restarts`, `detected_as`), and what a
    chaos fault is expected to be detected as. Every `EventKind` is one (a stop the policy orders on
    an event has the event's kind); a host reports the two reasons of a `CheckpointInvalid` apart."""

    CRASH = "crash"
    HANG = "hang"
    HOST_LOST = "host_lost"
    STRAGGLER = "straggler"
    CHECKPOINT_INVALID = "checkpoint_invalid"
    CAPACITY_RETURNED = "capacity_returned"
    ANNOUNCED_LOSS = "announced_loss"
    NONFINITE_LOSS = "nonfinite_loss"
    """A non-finite loss right after a restore: the restored step is bad (a CheckpointInvalid event)."""
    RESTORE_FAILED = "restore_failed"
    """No valid copy of the host's shard could be staged (a CheckpointInvalid event)."""
    SCALE_DOWN = "scale_down"
    """A member that rejoins after its slice was dropped stops its workload."""

    @property
    def event_kind(self) -> EventKind | None:
        """The policy event a fault of this kind is decided as (none for a scale-down's stop)."""
        if self in (FaultKind.NONFINITE_LOSS, FaultKind.RESTORE_FAILED):
            return EventKind.CHECKPOINT_INVALID
        return None if self is FaultKind.SCALE_DOWN else EventKind(self.value)


FAULT_KINDS = frozenset({EventKind.CRASH, EventKind.HANG, EventKind.HOST_LOST, EventKind.CHECKPOINT_INVALID})
"""The kinds that stop the running generation; `Context.faults_on` counts these."""


@dataclass(frozen=True, kw_only=True)
class Event:
    """Something the policy decides on. `step` is the job's high-water step when it happened."""

    kind: ClassVar[EventKind]
    t: float
    step: int
    generation: int

    @property
    def summary(self) -> str:
        """One short line for tables and logs, e.g. `crash on host 1 (exit code 1)`."""
        return str(self.kind)

    def to_json(self) -> dict[str, Any]:
        return {"kind": str(self.kind), **fields_to_json(self)}

    @staticmethod
    def from_json(data: Any) -> Event:
        record = mapping(data, "event")
        kind = record.get("kind")
        if not isinstance(kind, str) or kind not in EVENT_TYPES:
            raise ValueError(f"event: unknown kind {kind!r} (known: {', '.join(EVENT_TYPES)})")
        cls = EVENT_TYPES[EventKind(kind)]
        return cls(**fields_from_json(cls, record, f"{kind} event", tag="kind"))


@dataclass(frozen=True, kw_only=True)
class HostEvent(Event):
    """An event that concerns one host (its global index: slice * hosts_per_slice + worker)."""

    host: int

    @property
    def summary(self) -> str:
        return f"{self.kind} on host {self.host}"


@dataclass(frozen=True, kw_only=True)
class Crash(HostEvent):
    kind: ClassVar[EventKind] = EventKind.CRASH
    exit_code: int | None = None
    signal: str | None = None
    detail: str = ""

    @property
    def summary(self) -> str:
        how = f"signal {self.signal}" if self.signal else f"exit code {self.exit_code}"
        return f"{super().summary} ({how})"


@dataclass(frozen=True, kw_only=True)
class Hang(HostEvent):
    kind: ClassVar[EventKind] = EventKind.HANG
    silent_seconds: float | None = None
    detail: str = ""

    @property
    def summary(self) -> str:
        if self.silent_seconds is None:
            return super().summary
        return f"{super().summary} (silent {self.silent_seconds:.1f} s)"


@dataclass(frozen=True, kw_only=True)
class HostLost(HostEvent):
    kind: ClassVar[EventKind] = EventKind.HOST_LOST
    machine: str = ""

    @property
    def summary(self) -> str:
        return f"{super().summary} ({self.machine})" if self.machine else super().summary


@dataclass(frozen=True, kw_only=True)
class Straggler(HostEvent):
    kind: ClassVar[EventKind] = EventKind.STRAGGLER
    score: float

    @property
    def summary(self) -> str:
        return f"{super().summary} (score {self.score:.2f})"


@dataclass(frozen=True, kw_only=True)
class AnnouncedLoss(HostEvent):
    """`host`'s machine goes in `seconds_left` (`cause`: "maintenance" or "preemption"; `source`: the
    signal read). `saved_step`: the step every host saved on the notice, the job held after it (None:
    the save did not finish in time; a restart now restores the newest earlier checkpoint)."""

    kind: ClassVar[EventKind] = EventKind.ANNOUNCED_LOSS
    cause: str
    seconds_left: float
    saved_step: int | None = None
    source: str = ""

    @property
    def summary(self) -> str:
        saved = f"step {self.saved_step} saved" if self.saved_step is not None else "no step saved"
        return f"{super().summary} ({self.cause} in {self.seconds_left:.0f} s, {saved})"


@dataclass(frozen=True, kw_only=True)
class CheckpointInvalid(HostEvent):
    """`reason` is "nonfinite_loss" (the restored state gave a non-finite loss) or "restore_failed"
    (no valid copy of a shard was found)."""

    kind: ClassVar[EventKind] = EventKind.CHECKPOINT_INVALID
    checkpoint_step: int | None = None
    reason: str
    detail: str = ""

    @property
    def summary(self) -> str:
        at = "" if self.checkpoint_step is None else f" at step {self.checkpoint_step}"
        return f"{super().summary} ({self.reason}{at})"


@dataclass(frozen=True, kw_only=True)
class CapacityReturned(Event):
    kind: ClassVar[EventKind] = EventKind.CAPACITY_RETURNED
    spares: int

    @property
    def summary(self) -> str:
        return f"{self.kind} ({self.spares} spare(s))"


EVENT_TYPES: Mapping[EventKind, type[Event]] = MappingProxyType(
    {
        cls.kind: cls
        for cls in (Crash, Hang, HostLost, Straggler, CheckpointInvalid, CapacityReturned, AnnouncedLoss)
    }
)
