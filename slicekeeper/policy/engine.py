"""The policy engine: loads a user's policy file, asks it (or the default policy) for each decision.

One engine for the job's leader, the simulator and `slicekeeper policy replay`. A user's file is
checked when it is loaded, before the job starts: a file that cannot work (syntax error, no hook, a
misspelt hook, a hook that cannot take `(event, context)`) is a UserError naming the file and the hook.
At run time a user hook runs in a daemon thread under a time limit; a hook that raises, runs too long
or answers with an action the event does not allow (or that cannot be carried out now) costs nothing
but that decision: the default policy decides instead, and the decision says why (source `fallback`).

`evaluate` is pure (replay calls it on recorded contexts); `decide` also records the decision in the
history and charges its level's budget.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import itertools
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any

from slicekeeper.errors import UserError
from slicekeeper.policy import (
    HOOK_NAMES,
    Action,
    Budget,
    Context,
    Decision,
    DecisionSource,
    Event,
    EventKind,
    Fail,
    Level,
    Policy,
    RecoveryCosts,
    World,
    check_action,
)
from slicekeeper.policy.default import EscalationLadder

if TYPE_CHECKING:
    from slicekeeper.api import PolicyRef

Hook = Callable[[Any, Context], Action]
"""A hook as the engine calls it: `(event, context) -> Action`."""

CATCH_ALL = "on_event"
"""Optional hook for every event kind the file has no specific hook for."""
KNOWN_HOOKS = (*HOOK_NAMES.values(), CATCH_ALL)

DEFAULT_HOOK_TIMEOUT = 2.0
DEFAULT_LIMITS: Mapping[Level, tuple[int, float]] = MappingProxyType(
    {Level.RESTART: (10, 3600.0), Level.REPLACE: (4, 3600.0), Level.SCALE_DOWN: (4, 3600.0)}
)
"""Budget per level, (uses, window seconds): spec.policy.budgets has the same defaults."""
DEFAULT_POLICY: Policy = EscalationLadder()

_module_numbers = itertools.count()


@dataclass(frozen=True)
class UserPolicy:
    """A user's policy file, loaded and checked: its hooks by name."""

    path: Path
    hooks: Mapping[str, Hook]

    def hook_for(self, kind: EventKind) -> tuple[str, Hook] | None:
        """The hook that decides `kind`: its own hook, else the catch-all `on_event`, else None."""
        for name in (HOOK_NAMES[kind], CATCH_ALL):
            if name in self.hooks:
                return name, self.hooks[name]
        return None


def load_policy(path: str | Path) -> UserPolicy:
    """Import a user's policy file and check its hooks; UserError naming the file and the hook."""
    file = Path(path)
    try:
        file.read_bytes()
    except OSError as error:
        raise UserError(f"{file}: cannot read the policy file: {error.strerror or error}") from None
    module = _import(file)
    hooks: dict[str, Hook] = {}
    for name, value in vars(module).items():
        if not name.startswith("on_"):
            continue
        if name not in KNOWN_HOOKS:
            close = difflib.get_close_matches(name, KNOWN_HOOKS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UserError(
                f"{_where(file, value)}: unknown hook '{name}'{hint}; known hooks: {', '.join(KNOWN_HOOKS)} "
                "(names starting with 'on_' are reserved for hooks)"
            )
        hooks[name] = _checked_hook(file, name, value)
    if not hooks:
        raise UserError(f"{file}: defines no policy hook; define at least one of: {', '.join(KNOWN_HOOKS)}")
    return UserPolicy(path=file, hooks=MappingProxyType(hooks))


def _import(file: Path) -> ModuleType:
    # A unique name per load: two policies (or one loaded twice) never share a module.
    name = f"slicekeeper_user_policy_{next(_module_numbers)}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise UserError(f"{file}: cannot be imported as a Python module (name it *.py)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and typing in the user's file look their module up here
    try:
        spec.loader.exec_module(module)
    except SyntaxError as error:
        sys.modules.pop(name, None)
        where = f"{error.filename or file}:{error.lineno}" if error.lineno else str(file)
        raise UserError(f"{where}: syntax error in the policy: {error.msg}") from None
    except (Exception, SystemExit) as error:
        sys.modules.pop(name, None)
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == str(file)]
        where = f"{file}:{frames[-1].lineno}" if frames else str(file)
        raise UserError(
            f"{where}: the policy raised {type(error).__name__}: {error} while it was loaded"
        ) from None
    return module


def _where(file: Path, value: object) -> str:
    code = getattr(value, "__code__", None)
    return f"{file}:{code.co_firstlineno}" if code is not None else str(file)


def _checked_hook(file: Path, name: str, value: object) -> Hook:
    where = _where(file, value)
    if not callable(value):
        raise UserError(f"{where}: hook '{name}' must be a function, not {type(value).__name__}")
    if inspect.iscoroutinefunction(value) or inspect.isasyncgenfunction(value):
        raise UserError(f"{where}: hook '{name}' must be a plain function, not 'async def'")
    if inspect.isgeneratorfunction(value):
        raise UserError(f"{where}: hook '{name}' must return an Action, not yield")
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        raise UserError(f"{where}: hook '{name}': cannot read its signature") from None
    try:
        signature.bind(object(), object())
    except TypeError:
        raise UserError(
            f"{where}: hook '{name}{signature}' must take exactly two positional arguments: "
            f"def {name}(event, context)"
        ) from None
    return value  # type: ignore[return-value]


class BudgetLedger:
    """Uses of each ladder level over time; a budget counts the uses within its window."""

    def __init__(self, limits: Mapping[Level, tuple[int, float]] = DEFAULT_LIMITS) -> None:
        self.limits = {**DEFAULT_LIMITS, **limits}
        for level, (limit, window) in self.limits.items():
            if limit < 0 or window <= 0:
                raise ValueError(f"{level} budget: limit must be >= 0 and window > 0, not {limit}/{window}")
        self._uses: dict[Level, list[float]] = {level: [] for level in Level}

    def use(self, level: Level, t: float) -> None:
        self._uses[level].append(t)

    def uses(self) -> dict[str, list[float]]:
        """Every use so far (level -> times), as JSON: budgets carry on across a leader change."""
        return {str(level): list(times) for level, times in self._uses.items()}

    def carry_on(self, uses: Mapping[str, list[float]]) -> None:
        self._uses = {level: [float(t) for t in uses.get(str(level), [])] for level in Level}

    def budgets(self, now: float) -> dict[Level, Budget]:
        budgets = {}
        for level, (limit, window) in self.limits.items():
            used = sum(1 for t in self._uses[level] if t > now - window)
            budgets[level] = Budget(level=level, limit=limit, window_seconds=window, used=used)
        return budgets


@dataclass
class _HookOutcome:
    done: threading.Event = field(default_factory=threading.Event)
    action: object = None
    error: BaseException | None = None


def _call_with_limit(hook: Hook, event: Event, context: Context, seconds: float) -> _HookOutcome:
    """Run a hook in a daemon thread: a hook that never returns holds up neither us nor the exit."""
    outcome = _HookOutcome()

    def run() -> None:
        try:
            outcome.action = hook(event, context)
        except BaseException as error:  # a hook's SystemExit is its failure too, not ours
            outcome.error = error
        finally:
            outcome.done.set()

    threading.Thread(target=run, name=f"policy-hook-{event.kind}", daemon=True).start()
    outcome.done.wait(seconds)
    return outcome


class PolicyEngine:
    """Decides each event with the user's hook, or the default policy (see the module docstring)."""

    def __init__(
        self,
        user: UserPolicy | None = None,
        *,
        default: Policy = DEFAULT_POLICY,
        limits: Mapping[Level, tuple[int, float]] = DEFAULT_LIMITS,
        hook_timeout: float = DEFAULT_HOOK_TIMEOUT,
    ) -> None:
        if hook_timeout <= 0:
            raise ValueError(f"hook_timeout must be > 0, not {hook_timeout}")
        self.user = user
        self.default = default
        self.hook_timeout = hook_timeout
        self.ledger = BudgetLedger(limits)
        self._history: list[Decision] = []
        self._lock = threading.Lock()

    @classmethod
    def from_spec(cls, policy: PolicyRef) -> PolicyEngine:
        """The engine `spec.policy` describes: its file (an absolute path by the time the leader reads
        it), its budgets and its hook time limit."""
        if policy.file is None and policy.config_map is not None:
            raise UserError(
                f"spec.policy.configMap '{policy.config_map}' is read by the operator, which mounts it as "
                "spec.policy.file; locally use --policy FILE or spec.policy.file"
            )
        budgets = policy.budgets
        return cls(
            load_policy(policy.file) if policy.file else None,
            limits={
                Level.RESTART: (budgets.restart.max, budgets.restart.window_seconds),
                Level.REPLACE: (budgets.replace.max, budgets.replace.window_seconds),
                Level.SCALE_DOWN: (budgets.scale_down.max, budgets.scale_down.window_seconds),
            },
            hook_timeout=policy.hook_timeout_seconds,
        )

    @property
    def history(self) -> tuple[Decision, ...]:
        return tuple(self._history)

    def context(
        self,
        *,
        now: float | None = None,
        step: int,
        generation: int,
        spares: int,
        scores: Mapping[int, float],
        world: World,
        stragglers: tuple[int, ...] = (),
        costs: RecoveryCosts | None = None,
    ) -> Context:
        """The context of a decision now: the given facts plus this engine's history and budgets."""
        now = time.time() if now is None else now
        return Context(
            now=now,
            step=step,
            generation=generation,
            history=tuple(self._history),
            budgets=self.ledger.budgets(now),
            spares=spares,
            scores=scores,
            world=world,
            stragglers=stragglers,
            costs=costs,
        )

    def evaluate(self, event: Event, context: Context) -> Decision:
        """The decision on `event` in `context`; changes nothing (replay calls this)."""
        found = self.user.hook_for(event.kind) if self.user is not None else None
        if found is None:
            why = f"no {HOOK_NAMES[event.kind]} in {self.user.path.name}" if self.user else "no user policy"
            return self._default(event, context, DecisionSource.DEFAULT, f"default policy ({why})")
        name, hook = found
        assert self.user is not None
        where = f"{name} in {self.user.path.name}"
        outcome = _call_with_limit(hook, event, context, self.hook_timeout)
        if not outcome.done.is_set():
            problem = f"{where} exceeded its {self.hook_timeout} s limit"
        elif outcome.error is not None:
            problem = f"{where} raised {type(outcome.error).__name__}: {outcome.error}"
        else:
            refusal = check_action(event, outcome.action, context)
            if refusal is None:
                assert isinstance(outcome.action, Action)
                return Decision(
                    event=event,
                    action=outcome.action,
                    source=DecisionSource.USER,
                    reason=where,
                    t=context.now,
                )
            problem = f"{where} returned {outcome.action!r}, but {refusal}"
        return self._default(
            event, context, DecisionSource.FALLBACK, f"{problem}; the default policy decided"
        )

    def _default(self, event: Event, context: Context, source: DecisionSource, reason: str) -> Decision:
        hook = getattr(self.default, HOOK_NAMES[event.kind])
        try:
            action = hook(event, context)
        except Exception as error:
            return self._failed(
                event, context, source, f"the default policy raised {type(error).__name__}: {error}"
            )
        refusal = check_action(event, action, context)
        if refusal is not None:
            return self._failed(
                event, context, source, f"the default policy returned {action!r}, but {refusal}"
            )
        return Decision(event=event, action=action, source=source, reason=reason, t=context.now)

    @staticmethod
    def _failed(event: Event, context: Context, source: DecisionSource, why: str) -> Decision:
        reason = f"no valid remedy for {event.summary}: {why}"
        return Decision(event=event, action=Fail(reason=reason), source=source, reason=reason, t=context.now)

    def state(self) -> dict[str, Any]:
        """This engine's memory (its decisions, the budgets they used) as JSON: a leader that takes
        over carries it on (`carry_on`), so the policy's history and budgets never start again."""
        return {"history": [d.to_json() for d in self._history], "uses": self.ledger.uses()}

    def carry_on(self, state: Mapping[str, Any]) -> None:
        with self._lock:
            self._history = [Decision.from_json(d) for d in state["history"]]
            self.ledger.carry_on(state["uses"])

    def record(self, decision: Decision) -> None:
        """Add a decision to the history and charge its level's budget (if it has one)."""
        self._history.append(decision)
        if decision.action.level is not None:
            self.ledger.use(decision.action.level, decision.t)

    def decide(
        self,
        event: Event,
        *,
        now: float | None = None,
        step: int,
        generation: int,
        spares: int,
        scores: Mapping[int, float],
        world: World,
        stragglers: tuple[int, ...] = (),
        costs: RecoveryCosts | None = None,
    ) -> tuple[Decision, Context]:
        """Decide `event` now, record the decision; returns it with the context it was made in.

        Blocks for up to the hook time limit: call it from a worker thread in an event loop
        (`await asyncio.to_thread(engine.decide, ...)`). Calls are serialised."""
        with self._lock:
            context = self.context(
                now=now,
                step=step,
                generation=generation,
                spares=spares,
                scores=scores,
                world=world,
                stragglers=stragglers,
                costs=costs,
            )
            decision = self.evaluate(event, context)
            self.record(decision)
            return decision, context
