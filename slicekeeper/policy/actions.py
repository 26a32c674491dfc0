"""The actions a policy answers with, their budget levels, and which actions each event allows.

Part of the policy API; users import these names from slicekeeper.policy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, ClassVar

from slicekeeper.policy.codec import fields_from_json, fields_to_json, is_int, mapping, require
from slicekeeper.policy.events import EventKind


class ActionName(StrEnum):
    RESTART = "restart"
    REPLACE = "replace"
    SCALE_DOWN = "scale_down"
    SCALE_UP = "scale_up"
    WAIT = "wait"
    IGNORE = "ignore"
    FAIL = "fail"


class Level(StrEnum):
    """The budgeted rungs of the escalation ladder; each has its own budget (uses within a window)."""

    RESTART = "restart"
    REPLACE = "replace"
    SCALE_DOWN = "scale_down"


@dataclass(frozen=True, kw_only=True)
class Action:
    """What the policy wants done. `level` is the budget an action spends (None: no budget)."""

    name: ClassVar[ActionName]
    level: ClassVar[Level | None] = None

    def to_json(self) -> dict[str, Any]:
        return {"name": str(self.name), **fields_to_json(self)}

    @staticmethod
    def from_json(data: Any) -> Action:
        record = mapping(data, "action")
        name = record.get("name")
        if not isinstance(name, str) or name not in ACTION_TYPES:
            raise ValueError(f"action: unknown name {name!r} (known: {', '.join(ACTION_TYPES)})")
        cls = ACTION_TYPES[ActionName(name)]
        return cls(**fields_from_json(cls, record, f"{name} action", tag="name"))


@dataclass(frozen=True, kw_only=True)
class RestartInJob(Action):
    """Every host restarts its workload process from the newest checkpoint all hosts can restore."""

    name: ClassVar[ActionName] = ActionName.RESTART
    level: ClassVar[Level | None] = Level.RESTART


@dataclass(frozen=True, kw_only=True)
class ReplaceHost(Action):
    """A spare machine takes over `host`'s identity (hot-swap); the job restarts, the newcomer restores
    its shard from a peer or persistent copy."""

    name: ClassVar[ActionName] = ActionName.REPLACE
    level: ClassVar[Level | None] = Level.REPLACE
    host: int

    def __post_init__(self) -> None:
        require(
            is_int(self.host) and self.host >= 0, f"ReplaceHost.host must be a host index, not {self.host!r}"
        )


@dataclass(frozen=True, kw_only=True)
class ScaleDown(Action):
    """Continue on fewer slices: drop `slices` (empty: the slice holding the event's host) and restart on
    the smaller mesh from the newest valid checkpoint, resharded."""

    name: ClassVar[ActionName] = ActionName.SCALE_DOWN
    level: ClassVar[Level | None] = Level.SCALE_DOWN
    slices: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        slices = tuple(self.slices)
        require(
            all(is_int(s) and s >= 0 for s in slices) and len(set(slices)) == len(slices),
            f"ScaleDown.slices must be distinct slice indices, not {self.slices!r}",
        )
        object.__setattr__(self, "slices", slices)


@dataclass(frozen=True, kw_only=True)
class ScaleUp(Action):
    """Bring back the dropped slices that can be restored now (`World.restorable_slices`)."""

    name: ClassVar[ActionName] = ActionName.SCALE_UP


@dataclass(frozen=True, kw_only=True)
class Wait(Action):
    """Do nothing now; the same event is offered again after `seconds`, with a fresh context."""

    name: ClassVar[ActionName] = ActionName.WAIT
    seconds: float

    def __post_init__(self) -> None:
        ok = isinstance(self.seconds, int | float) and not isinstance(self.seconds, bool)
        require(
            ok and math.isfinite(self.seconds) and self.seconds > 0,
            f"Wait.seconds must be > 0, not {self.seconds!r}",
        )


@dataclass(frozen=True, kw_only=True)
class Ignore(Action):
    """Do nothing: the event is only reported."""

    name: ClassVar[ActionName] = ActionName.IGNORE


@dataclass(frozen=True, kw_only=True)
class Fail(Action):
    """Fail the job now with `reason` (shown by `slicekeeper run` and in the report)."""

    name: ClassVar[ActionName] = ActionName.FAIL
    reason: str

    def __post_init__(self) -> None:
        require(
            isinstance(self.reason, str) and bool(self.reason.strip()), "Fail.reason must be a non-empty text"
        )


ACTION_TYPES: Mapping[ActionName, type[Action]] = MappingProxyType(
    {cls.name: cls for cls in (RestartInJob, ReplaceHost, ScaleDown, ScaleUp, Wait, Ignore, Fail)}
)

_ON_A_FAULT = frozenset(
    {ActionName.RESTART, ActionName.REPLACE, ActionName.SCALE_DOWN, ActionName.WAIT, ActionName.FAIL}
)
ALLOWED_ACTIONS: Mapping[EventKind, frozenset[ActionName]] = MappingProxyType(
    {
        EventKind.CRASH: _ON_A_FAULT,
        EventKind.HANG: _ON_A_FAULT,
        EventKind.CHECKPOINT_INVALID: _ON_A_FAULT,
        # The machine is gone: restarting in place cannot bring it back.
        EventKind.HOST_LOST: frozenset(
            {ActionName.REPLACE, ActionName.SCALE_DOWN, ActionName.WAIT, ActionName.FAIL}
        ),
        # The job still runs: doing nothing (Ignore) is an answer; restarting would not change the host.
        EventKind.STRAGGLER: frozenset(
            {ActionName.REPLACE, ActionName.SCALE_DOWN, ActionName.IGNORE, ActionName.WAIT, ActionName.FAIL}
        ),
        EventKind.CAPACITY_RETURNED: frozenset({ActionName.SCALE_UP, ActionName.IGNORE, ActionName.WAIT}),
        # The machine still runs, for now: take it out ahead (replace, scale down), or let the loss
        # come (Ignore: the step saved on the notice is what the restart then restores).
        EventKind.ANNOUNCED_LOSS: frozenset(
            {ActionName.REPLACE, ActionName.SCALE_DOWN, ActionName.IGNORE, ActionName.WAIT, ActionName.FAIL}
        ),
    }
)
"""Which actions each event kind allows (docs/policy.md has the same table)."""
