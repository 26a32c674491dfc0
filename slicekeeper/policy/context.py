"""What a hook sees and how its answer is checked: the context, budgets, decisions, `check_action`.

A hook is called as `on_crash(event, context)`; this module defines that read-only `Context` (the
job's history of decisions, each ladder level's `Budget`, spares, straggler scores and the current
`World`), the `Decision` the engine records, the `Policy` protocol a complete policy satisfies, and
`check_action`, the one check of whether an answer is allowed for its event and feasible now. The
engine (slicekeeper.policy.engine) refuses any answer `check_action` finds a problem with and falls
back to the default policy (slicekeeper.policy.default).

Part of the policy API; users import these names from slicekeeper.policy. Stdlib only, like the rest
of that package's API; every object converts to JSON and back (`to_json` / `from_json`) for the
leader's event log and `slicekeeper policy replay`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Protocol

from slicekeeper.policy.actions import (
    ACTION_TYPES,
    ALLOWED_ACTIONS,
    Action,
    Level,
    ReplaceHost,
    ScaleDown,
    ScaleUp,
    Wait,
)
from slicekeeper.policy.codec import fields_from_json, fields_to_json, mapping, typed
from slicekeeper.policy.costs import RecoveryCosts, expected_cost
from slicekeeper.policy.events import (
    FAULT_KINDS,
    CapacityReturned,
    CheckpointInvalid,
    Crash,
    Event,
    EventKind,
    Hang,
    HostEvent,
    HostLost,
    Straggler,
)
from slicekeeper.shape import JobShape

# --- what a hook sees -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Budget:
    """One ladder level's budget: at most `limit` uses within any `window_seconds`."""

    level: Level
    limit: int
    window_seconds: float
    used: int

    @property
    def left(self) -> int:
        return max(0, self.limit - self.used)

    def to_json(self) -> dict[str, Any]:
        return {"level": str(self.level), **fields_to_json(self, skip={"level"})}

    @staticmethod
    def from_json(data: Any) -> Budget:
        record = mapping(data, "budget")
        level = _level(record.get("level"), "budget.level")
        return Budget(level=level, **fields_from_json(Budget, record, "budget", skip={"level"}))


@dataclass(frozen=True, kw_only=True)
class World:
    """The job's current shape. Slice s holds hosts s*hosts_per_slice .. (s+1)*hosts_per_slice-1;
    a dropped slice keeps its host ids for when it comes back."""

    active_slices: tuple[int, ...]
    full_slices: int
    min_slices: int
    hosts_per_slice: int
    devices_per_host: int
    idle_hosts: tuple[int, ...] = ()
    """Healthy machines of dropped slices (they wait to come back with their slice)."""
    restorable_slices: int = 0
    """How many dropped slices could be brought back now (the leader counts idle hosts and spares)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "active_slices", tuple(sorted(self.active_slices)))
        object.__setattr__(self, "idle_hosts", tuple(sorted(self.idle_hosts)))

    @property
    def shape(self) -> JobShape:
        """The full job's shape (slicekeeper.shape): which host is in which slice."""
        return JobShape(self.full_slices, self.hosts_per_slice, self.devices_per_host)

    @property
    def hosts(self) -> tuple[int, ...]:
        """The hosts of the active slices, in order."""
        return self.shape.hosts_in(self.active_slices)

    @property
    def size(self) -> int:
        return len(self.hosts)

    @property
    def mesh(self) -> Mapping[str, int]:
        """The mesh a multislice job trains on (the reference trainer's): data parallel over the active
        slices (`replica`), state split over the hosts of a slice (`fsdp`) and over a host's devices
        (`model`)."""
        return MappingProxyType(
            {"replica": len(self.active_slices), "fsdp": self.hosts_per_slice, "model": self.devices_per_host}
        )

    @property
    def scaled_down(self) -> bool:
        return len(self.active_slices) < self.full_slices

    @property
    def dropped_slices(self) -> tuple[int, ...]:
        return tuple(s for s in range(self.full_slices) if s not in self.active_slices)

    def slice_of(self, host: int) -> int:
        return self.shape.slice_of(host)

    def to_json(self) -> dict[str, Any]:
        return fields_to_json(self)

    @staticmethod
    def from_json(data: Any) -> World:
        return World(**fields_from_json(World, mapping(data, "world"), "world"))


class DecisionSource(StrEnum):
    USER = "user"
    """The user's hook decided."""
    DEFAULT = "default"
    """The user policy has no hook for this event (or there is no user policy): the default decided."""
    FALLBACK = "fallback"
    """The user's hook raised, timed out or returned an invalid action: the default decided instead."""


@dataclass(frozen=True, kw_only=True)
class Decision:
    event: Event
    action: Action
    source: DecisionSource
    reason: str
    t: float

    def to_json(self, *, with_event: bool = True) -> dict[str, Any]:
        record: dict[str, Any] = {"event": self.event.to_json()} if with_event else {}
        record.update(action=self.action.to_json(), source=str(self.source), reason=self.reason, t=self.t)
        return record

    @staticmethod
    def from_json(data: Any, *, event: Event | None = None) -> Decision:
        """Decode a decision; `event` supplies the event when the record was written without it."""
        record = mapping(data, "decision")
        source = record.get("source")
        if source not in DecisionSource.__members__.values():
            raise ValueError(f"decision.source: {source!r} is not one of user, default, fallback")
        return Decision(
            event=event if event is not None else Event.from_json(record.get("event")),
            action=Action.from_json(record.get("action")),
            source=DecisionSource(str(source)),
            reason=typed(record.get("reason"), str, "decision.reason"),
            t=typed(record.get("t"), float, "decision.t"),
        )


@dataclass(frozen=True, kw_only=True)
class Context:
    """What a hook knows when it decides, read-only: mappings are read-only views, sequences tuples.

    `history` holds every earlier decision of this job (oldest first, not the one being made),
    `budgets` every level's budget, `spares` the spare machines ready to take over a host, `scores`
    each host's straggler score, `stragglers` the hosts currently flagged as stragglers.
    """

    now: float
    step: int
    generation: int
    history: tuple[Decision, ...]
    budgets: Mapping[Level, Budget]
    spares: int
    scores: Mapping[int, float]
    world: World
    stragglers: tuple[int, ...] = ()
    costs: RecoveryCosts | None = None
    """What recoveries cost in this job, where the leader knows (see `expected_cost`)."""

    def __post_init__(self) -> None:
        missing = [str(level) for level in Level if level not in self.budgets]
        if missing:
            raise ValueError(f"Context.budgets lacks level(s): {', '.join(missing)}")
        object.__setattr__(self, "history", tuple(self.history))
        object.__setattr__(self, "budgets", MappingProxyType({Level(k): v for k, v in self.budgets.items()}))
        object.__setattr__(self, "scores", MappingProxyType(dict(self.scores)))
        object.__setattr__(self, "stragglers", tuple(self.stragglers))

    def left(self, level: Level) -> int:
        """Uses of `level` left in its budget now."""
        return self.budgets[level].left

    def faults(self, *, host: int | None = None, within_seconds: float | None = None) -> tuple[Event, ...]:
        """Earlier faults (crash, hang, host_lost, checkpoint_invalid) in the history, oldest first;
        optionally only those of `host`, only those that happened within the last `within_seconds`.
        A fault put off with Wait counts once, when it was finally answered otherwise. The event being
        decided is not among them."""
        since = -math.inf if within_seconds is None else self.now - within_seconds
        found = {
            d.event: None
            for d in self.history
            if d.event.kind in FAULT_KINDS
            and d.event.t >= since
            and not isinstance(d.action, Wait)
            and (host is None or getattr(d.event, "host", None) == host)
        }
        return tuple(found)

    def waited_seconds(self, event: Event) -> float:
        """How long `event` has been put off: seconds since the first of the Wait answers to it (same
        kind, same host) that no other answer has ended since; 0.0 when it was not put off."""
        first_wait: float | None = None
        host = getattr(event, "host", None)
        for decision in self.history:
            if decision.event.kind != event.kind or getattr(decision.event, "host", None) != host:
                continue
            if isinstance(decision.action, Wait):
                first_wait = decision.t if first_wait is None else first_wait
            else:
                first_wait = None
        return 0.0 if first_wait is None else max(0.0, self.now - first_wait)

    def faults_on(self, host: int, within_seconds: float | None = None) -> int:
        """How many earlier faults `host` had (see `faults`)."""
        return len(self.faults(host=host, within_seconds=within_seconds))

    def expected_cost(self, action: Action, host: int | None = None) -> float | None:
        """Seconds of the whole job's training `action` is expected to lose (slicekeeper.policy.costs),
        `host` the host the event is about; None when this context has no recovery costs."""
        return None if self.costs is None else expected_cost(action, self, host)

    def can_restart(self) -> bool:
        return self.left(Level.RESTART) >= 1

    def can_replace(self, host: int) -> bool:
        """A spare is ready, `host` is in the job and the replace budget has a use left."""
        return _replace_problem(self, host) is None

    def can_scale_down(self, slices: Iterable[int]) -> bool:
        """Dropping `slices` keeps at least spec.minSlices and the scale-down budget has a use left."""
        return _scale_down_problem(self, tuple(slices)) is None

    def can_scale_up(self) -> bool:
        return _scale_up_problem(self) is None

    def to_json(self, *, with_history: bool = True) -> dict[str, Any]:
        record: dict[str, Any] = {"now": self.now, "step": self.step, "generation": self.generation}
        if with_history:
            record["history"] = [d.to_json() for d in self.history]
        else:
            record["history_length"] = len(self.history)
        record.update(
            budgets={str(level): b.to_json() for level, b in self.budgets.items()},
            spares=self.spares,
            scores={str(host): score for host, score in self.scores.items()},
            world=self.world.to_json(),
            stragglers=list(self.stragglers),
        )
        if self.costs is not None:
            record["costs"] = self.costs.to_json()
        return record

    @staticmethod
    def from_json(data: Any, *, history: Iterable[Decision] | None = None) -> Context:
        """Decode a context; `history` supplies it when the record was written without it."""
        record = mapping(data, "context")
        if history is None:
            raw = record.get("history")
            if not isinstance(raw, list):
                raise ValueError("context.history: expected a list of decisions")
            history = [Decision.from_json(d) for d in raw]
        budgets = mapping(record.get("budgets"), "context.budgets")
        scores = mapping(record.get("scores"), "context.scores")
        try:
            score_map = {int(h): float(s) for h, s in scores.items()}
        except (TypeError, ValueError):
            raise ValueError("context.scores: expected {host: score}") from None
        return Context(
            now=typed(record.get("now"), float, "context.now"),
            step=typed(record.get("step"), int, "context.step"),
            generation=typed(record.get("generation"), int, "context.generation"),
            history=tuple(history),
            budgets={_level(k, "context.budgets"): Budget.from_json(v) for k, v in budgets.items()},
            spares=typed(record.get("spares"), int, "context.spares"),
            scores=score_map,
            world=World.from_json(record.get("world")),
            stragglers=typed(record.get("stragglers", []), tuple[int, ...], "context.stragglers"),
            costs=None if record.get("costs") is None else RecoveryCosts.from_json(record["costs"]),
        )


# --- the policy protocol and the engine's check --------------------------------------------------------


class Policy(Protocol):
    """A complete policy: one hook per event kind (the default policy is one, `EscalationLadder`).

    A user's policy file defines any subset of these as module-level functions."""

    def on_crash(self, event: Crash, context: Context) -> Action: ...
    def on_hang(self, event: Hang, context: Context) -> Action: ...
    def on_host_lost(self, event: HostLost, context: Context) -> Action: ...
    def on_straggler(self, event: Straggler, context: Context) -> Action: ...
    def on_checkpoint_invalid(self, event: CheckpointInvalid, context: Context) -> Action: ...
    def on_capacity_returned(self, event: CapacityReturned, context: Context) -> Action: ...


HOOK_NAMES: Mapping[EventKind, str] = MappingProxyType({kind: f"on_{kind}" for kind in EventKind})
"""The hook that decides each event kind."""


def check_action(event: Event, action: object, context: Context) -> str | None:
    """Why `action` cannot be the answer to `event` now (None: it is allowed and feasible).

    The engine refuses (and falls back on) any answer this finds a problem with; a hook may call it to
    test an action before returning it."""
    if not isinstance(action, Action) or type(action) not in ACTION_TYPES.values():
        return f"it is not an Action (a {type(action).__name__}; return e.g. RestartInJob())"
    allowed = ALLOWED_ACTIONS[event.kind]
    if action.name not in allowed:
        names = ", ".join(sorted(str(a) for a in allowed))
        return f"a {event.kind} event does not allow '{action.name}' (allowed: {names})"
    if isinstance(action, ReplaceHost):
        if isinstance(event, HostLost) and action.host != event.host:
            return f"on host_lost only the lost host ({event.host}) can be replaced"
        return _replace_problem(context, action.host)
    if isinstance(action, ScaleDown):
        slices = action.slices
        if not slices:
            if not isinstance(event, HostEvent):
                return "ScaleDown() without slices needs an event of a host"
            slices = (context.world.slice_of(event.host),)
        if isinstance(event, HostLost) and context.world.slice_of(event.host) not in slices:
            return (
                f"the lost host {event.host} is in slice {context.world.slice_of(event.host)}, which it keeps"
            )
        return _scale_down_problem(context, slices)
    if isinstance(action, ScaleUp):
        return _scale_up_problem(context)
    if action.level is not None:
        return _budget_problem(context, action.level)
    return None


def _budget_problem(context: Context, level: Level) -> str | None:
    budget = context.budgets[level]
    if budget.left >= 1:
        return None
    return (
        f"the {level} budget is spent ({budget.used} of {budget.limit} within "
        f"{budget.window_seconds:g} s, spec.policy.budgets.{_SPEC_NAMES[level]})"
    )


_SPEC_NAMES = {Level.RESTART: "restart", Level.REPLACE: "replace", Level.SCALE_DOWN: "scaleDown"}


def _replace_problem(context: Context, host: int) -> str | None:
    world = context.world
    # By its slice: the hosts of 25,000 are not listed for each decision, nor named in its refusal.
    if not 0 <= host < world.full_slices * world.hosts_per_slice or (
        host // world.hosts_per_slice not in world.active_slices
    ):
        return (
            f"host {host} is not an active host of the job (active: {_ranges(world.hosts)})"
            if len(world.active_slices) * world.hosts_per_slice <= MAX_LISTED
            else f"host {host} is not an active host of the job (its slice is not one of the "
            f"{len(world.active_slices)} active)"
        )
    if context.spares < 1:
        return "no spare is available"
    return _budget_problem(context, Level.REPLACE)


def _scale_down_problem(context: Context, slices: tuple[int, ...]) -> str | None:
    world = context.world
    inactive = [s for s in slices if s not in world.active_slices]
    if inactive:
        return f"slice(s) {inactive} not active (active: {list(world.active_slices)})"
    left = len(world.active_slices) - len(set(slices))
    if left < world.min_slices:
        return f"that would leave {left} slice(s), below spec.minSlices={world.min_slices}"
    return _budget_problem(context, Level.SCALE_DOWN)


def _scale_up_problem(context: Context) -> str | None:
    if not context.world.scaled_down:
        return "the job already runs on all its slices"
    if context.world.restorable_slices < 1:
        return "no dropped slice can be restored now (world.restorable_slices is 0)"
    return None


MAX_LISTED = 64
"""A refusal lists the active hosts up to this many (beyond: how many slices are active)."""


def _ranges(hosts: tuple[int, ...]) -> str:
    return ", ".join(str(h) for h in hosts) or "none"


def _level(value: Any, what: str) -> Level:
    if value not in Level.__members__.values():
        raise ValueError(f"{what}: unknown level {value!r} (known: {', '.join(Level)})")
    return Level(value)
