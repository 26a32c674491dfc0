"""The fleet simulator's run: a job at its real size, failures from a schedule, time simulated.

What is real: the restart state machine (supervisor.leader.restart_machine: every stop and start goes
through its transitions, with the job's restart rule) and the policy engine (slicekeeper.policy: the
user's `--policy` file or the default ladder, with the spec's budgets, asked at every event with the
simulated time). What is simulated: time, the cluster (which machine fails, spares, new machines) and
the workload (steps, checkpoints, restores), whose costs come from supervisor.fleet.costs.

The accounting is in chip-seconds, in the report's badput categories: productive (steps kept),
wasted_progress (steps trained and rolled back), checkpoint_save (the blocking part of each save),
infrastructure_recovery (detection, the restart round, a wait for a machine), tpu_initialization
(distributed init), checkpoint_restore, program_startup, scaled_down (chips of dropped slices).

Simplifications (docs/simulator.md): a failure that comes during a recovery is taken when the job
trains again; a straggler is not simulated; an announced loss is saved for at its notice.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from enum import StrEnum

from slicekeeper.supervisor.fleet.costs import CostModel
from slicekeeper.supervisor.fleet.failures import Effect, Failure
from slicekeeper.supervisor.leader import restart_machine as machine
from slicekeeper.supervisor.leader.journal import JobState
from slicekeeper.supervisor.leader.restart_rule import RestartRule

from slicekeeper import policy
from slicekeeper.goodput import Category
from slicekeeper.policy.engine import PolicyEngine
from slicekeeper.policy.events import FaultKind
from slicekeeper.shape import JobShape

EPOCH = 1_800_000_000.0
"""Simulated time 0 as Unix time, for the policy's budget windows."""


class Mode(StrEnum):
    SLICEKEEPER = "slicekeeper"
    """The product: in-job restarts from the local tier, hot-swaps from the peer tier, the policy."""
    PERSISTENT_RESTART = "restart from persistent"
    """What most jobs do today: every pod recreated, every host restored from the persistent tier, a
    lost machine waited for."""


@dataclass(frozen=True)
class Job:
    shape: JobShape
    min_slices: int
    interval: int
    """Steps between local saves (spec.checkpoint.interval)."""
    persistent_interval: int
    """Steps between persistent saves (the restart-from-persistent baseline's checkpoints)."""
    spares: int
    rule: RestartRule
    new_machines: bool = True
    """In a cluster a lost host gets a new machine (later) even with no spare standing by, and a
    dropped slice's machines come back; a local run (a replay) has only its spares."""

    @property
    def chips(self) -> int:
        return self.shape.host_count * self.shape.devices_per_host


@dataclass
class Result:
    name: str
    seconds: float
    chips: int
    chip_seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    decisions: Counter[str] = field(default_factory=Counter)
    recoveries: dict[str, list[float]] = field(default_factory=dict)
    """Fault kind -> seconds from each failure to training again."""
    failures: int = 0
    failure_reason: str | None = None
    steps: float = 0.0
    """Steps done at the end."""

    @property
    def goodput(self) -> float:
        return self.chip_seconds[Category.PRODUCTIVE] / (self.chips * self.seconds)

    def badput_seconds(self, digits: int = 1) -> dict[str, float]:
        """Each category's chip-seconds as seconds of the whole job (they add up with the productive
        time to the simulated span)."""
        return {
            c: round(v / self.chips, digits)
            for c, v in sorted(self.chip_seconds.items())
            if c != Category.PRODUCTIVE and v > 0
        }

    def mean_recovery(self) -> dict[str, float]:
        return {k: round(sum(v) / len(v), 1) for k, v in sorted(self.recoveries.items()) if v}


@dataclass
class Simulation:
    job: Job
    costs: CostModel
    engine: PolicyEngine | None
    mode: Mode = Mode.SLICEKEEPER
    name: str = "slicekeeper"
    now: float = 0.0
    steps: float = 0.0
    """Steps completed since the start (fractional: the step under way)."""
    local_step: int = 0
    persistent_step: int = 0
    active: set[int] = field(default_factory=set)
    spares: int = 0
    spare_returns: list[float] = field(default_factory=list)
    slice_returns: list[float] = field(default_factory=list)
    state: machine.RestartState = field(default_factory=machine.RestartState)
    worlds_run: set[tuple[int, ...]] = field(default_factory=set)
    result: Result | None = None
    step_seconds_by_slices: dict[int, float] = field(default_factory=dict)
    """A world's step time where it differs from the cost model's (a replay measures each world's:
    on one machine fewer hosts share its cores)."""
    leader: int = 0
    """The host whose supervisor leads: losing its machine is detected when its lease runs out."""
    _hosts_of_world: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())

    def __post_init__(self) -> None:
        self.active = set(range(self.job.shape.slices))
        self.spares = self.job.spares
        self.worlds_run = {tuple(sorted(self.active))}
        self.state, _ = machine.replay(
            machine.RestartState(), [machine.AllRegistered(), machine.Started(0)], self.job.rule
        )

    # --- the run ------------------------------------------------------------------------------
    def run(
        self,
        failures: list[Failure],
        seconds: float,
        *,
        start: dict[str, float] | None = None,
        until_step: int | None = None,
        end_seconds: float = 0.0,
    ) -> Result:
        """The job over `seconds` with `failures`. `start`: the first start's seconds by category (by
        default the cost model's distributed init, prep and compile). `until_step`: the job ends when
        it has done that many steps (a replayed run ended there), `end_seconds` later."""
        self.result = Result(self.name, seconds, self.job.chips)
        for category, spent in (start if start is not None else self._first_start()).items():
            self._stall(category, spent)
        for failure in failures:
            if self.state.over:
                break
            if failure.step is not None:  # just before the step it came in
                if until_step is not None and failure.step > until_step:
                    break
                self._train_to_step(failure.step - 1, seconds)
                if self.now >= seconds:
                    break
            else:
                if until_step is not None and self.now + self._seconds_to_step(until_step) <= failure.t:
                    break
                self._train_until(min(failure.t, seconds), seconds)
                if failure.t >= seconds:
                    break
            self._fail(failure)
        if until_step is not None and not self.state.over:
            self._train_to_step(until_step, seconds)
            self._stall(Category.OTHER, max(0.0, min(end_seconds, seconds - self.now)))
            self.result.seconds = self.now
        elif not self.state.over:
            self._train_until(seconds, seconds)
        if self.state.phase is JobState.FAILED and self.now < seconds:
            if until_step is None:
                self.result.chip_seconds[Category.OTHER] += (seconds - self.now) * self.job.chips
            else:
                self.result.seconds = self.now
            self.result.failure_reason = self.state.failure_reason
        self.result.steps = self.steps
        return self.result

    def _first_start(self) -> dict[str, float]:
        c = self.costs
        return {
            Category.TPU_INITIALIZATION: c.distributed_init_seconds,
            Category.TRAINING_PREP: c.prep_seconds,
            Category.PROGRAM_STARTUP: c.program_compile_seconds,
        }

    def _world_hosts(self) -> tuple[int, ...]:
        """The hosts of the active slices (kept while they stay the same: 25,000 of them)."""
        key = tuple(sorted(self.active))
        if self._hosts_of_world[0] != key:
            self._hosts_of_world = (key, self.job.shape.hosts_in(key))
        return self._hosts_of_world[1]

    # --- training -----------------------------------------------------------------------------
    def _active_chips(self) -> int:
        return len(self.active) * self.job.shape.hosts_per_slice * self.job.shape.devices_per_host

    def _book(self, category: str, seconds: float, chips: int | None = None) -> None:
        assert self.result is not None
        chips = self._active_chips() if chips is None else chips
        self.result.chip_seconds[category] += seconds * chips
        idle = self.job.chips - self._active_chips()
        if idle and chips != self.job.chips:
            self.result.chip_seconds[Category.SCALED_DOWN] += seconds * idle

    def _train_until(self, until: float, end: float) -> None:
        """Train from now to `until` (capacity coming back on the way is offered to the policy)."""
        while self.slice_returns and self.slice_returns[0] <= until and not self.state.over:
            back = self.slice_returns.pop(0)
            self._train(back - self.now)
            self._capacity_returned()
        self._train(until - self.now)

    def _train_to_step(self, step: int, end: float) -> None:
        """Train until the job has done `step` steps (or `end` comes), capacity coming back on the way
        offered to the policy (a scale-up goes back to a checkpoint: the target is reached later)."""
        while not self.state.over and self.steps < step and self.now < end:
            until = min(end, self.now + self._seconds_to_step(step))
            if self.slice_returns and self.slice_returns[0] <= until:
                self._train_until(self.slice_returns[0], end)
                continue
            self._train(until - self.now)
            if until < end:
                self._set_steps(float(step))  # exact: no rounding left over

    def _step_seconds(self) -> float:
        """The step time of the world that trains now."""
        return self.step_seconds_by_slices.get(len(self.active), self.costs.step_seconds)

    def _interval(self) -> int:
        return self.job.interval if self.mode is Mode.SLICEKEEPER else self.job.persistent_interval

    def _steps_after(self, seconds: float) -> float:
        """The steps done after training `seconds` from now: a step every step_seconds, a blocking
        save each time a checkpoint step is passed (not the one a restore started from)."""
        c, interval, done, step = self.costs, self._interval(), self.steps, self._step_seconds()
        to_boundary = (math.floor(done / interval) + 1) * interval - done
        if seconds <= to_boundary * step:
            return done + seconds / step
        seconds -= to_boundary * step
        cycles, rest = divmod(seconds, c.snapshot() + interval * step)
        return done + to_boundary + cycles * interval + max(0.0, rest - c.snapshot()) / step

    def _seconds_to_step(self, step: float) -> float:
        """How long training takes from now to `step` steps done (0 when they are)."""
        if step <= self.steps:
            return 0.0
        interval = self._interval()
        saves = max(0, math.ceil(step / interval) - 1 - math.floor(self.steps / interval))
        return (step - self.steps) * self._step_seconds() + saves * self.costs.snapshot()

    def _train(self, seconds: float) -> None:
        if seconds <= 0:
            return
        reached = self._steps_after(seconds)
        productive = (reached - self.steps) * self._step_seconds()
        self._book(Category.PRODUCTIVE, productive)
        self._book(Category.CHECKPOINT_SAVE, seconds - productive)
        self._set_steps(reached)
        self.now += seconds

    def _set_steps(self, steps: float) -> None:
        self.steps = steps
        self.local_step = int(steps // self.job.interval) * self.job.interval
        self.persistent_step = int(steps // self.job.persistent_interval) * self.job.persistent_interval

    def _stall(self, category: str, seconds: float) -> None:
        self._book(category, seconds)
        self.now += seconds

    def _roll_back_to(self, step: int) -> None:
        """Steps trained after `step` are thrown away: their time was wasted."""
        lost = max(0.0, self.steps - step) * self._step_seconds() * self._active_chips()
        assert self.result is not None
        self.result.chip_seconds[Category.PRODUCTIVE] -= lost
        self.result.chip_seconds[Category.WASTED_PROGRESS] += lost
        self.steps = float(step)

    # --- a failure ----------------------------------------------------------------------------
    def _hosts_hit(self, failure: Failure) -> list[int]:
        per = self.job.shape.hosts_per_slice
        if failure.category.whole_slice:
            first = failure.host // per * per
            return list(range(first, first + per))
        return [failure.host]

    def _fail(self, failure: Failure) -> None:
        assert self.result is not None
        effect = failure.category.effect
        if effect is not Effect.CAPACITY and self.job.shape.slice_of(failure.host) not in self.active:
            return  # a machine of a dropped slice: nothing trains there
        if effect is Effect.CAPACITY:
            self._machine_back()
            return
        self.result.failures += 1
        started = self.now
        if self.mode is Mode.PERSISTENT_RESTART:
            self._restart_from_persistent(failure)
        elif effect is Effect.MAINTENANCE:
            self._announced(failure)
        else:
            self._unannounced(failure)
        self.result.recoveries.setdefault(str(effect), []).append(self.now - started)

    def _detect(self, effect: Effect) -> float:
        c = self.costs
        return {
            Effect.CRASH: c.crash_detect_seconds,
            Effect.HANG: c.hang_detect(),
            Effect.HOST_LOST: c.lost_detect_seconds,
            Effect.CORRUPT: c.crash_detect_seconds,
        }.get(effect, 0.0)

    def _events(self, failure: Failure) -> list[policy.Event]:
        """The policy events a failure is decided as (a whole slice's: one per host)."""
        t, step, generation = EPOCH + self.now, int(self.steps), self.state.generation
        effect, name = failure.category.effect, failure.category.name
        hosts = self._hosts_hit(failure)
        if effect is Effect.CRASH:
            return [
                policy.Crash(t=t, step=step, generation=generation, host=hosts[0], exit_code=1, detail=name)
            ]
        if effect is Effect.HANG:
            silent = self.costs.hang_detect()
            return [policy.Hang(t=t, step=step, generation=generation, host=hosts[0], silent_seconds=silent)]
        if effect is Effect.CORRUPT:
            return [
                policy.CheckpointInvalid(
                    t=t,
                    step=step,
                    generation=generation,
                    host=hosts[0],
                    reason="nonfinite_loss",
                    checkpoint_step=step,
                )
            ]
        if effect is Effect.MAINTENANCE:
            return [
                policy.AnnouncedLoss(
                    t=t,
                    step=step,
                    generation=generation,
                    host=h,
                    cause="maintenance",
                    seconds_left=3600.0,
                    saved_step=step,
                )
                for h in hosts
            ]
        return [
            policy.HostLost(t=t, step=step, generation=generation, host=h, machine=f"machine-{h}")
            for h in hosts
        ]

    def _unannounced(self, failure: Failure) -> None:
        effect = failure.category.effect
        hit = self._hosts_hit(failure)
        if effect is Effect.HOST_LOST and self.leader in hit:
            # The leader's machine: the others notice when its lease runs out, and one of them leads.
            self._stall(Category.INFRASTRUCTURE_RECOVERY, self.costs.leader_lost_detect_seconds)
            self.leader = min((h for h in self._world_hosts() if h not in hit), default=self.leader)
        else:
            self._stall(Category.INFRASTRUCTURE_RECOVERY, self._detect(effect))
        kind = FaultKind.CHECKPOINT_INVALID if effect is Effect.CORRUPT else FaultKind(str(effect))
        if not self._stop(failure.host, kind, failure.category.name):
            return
        restore = self.local_step
        if effect is Effect.CORRUPT:  # the newest step holds the bad state too
            restore = max(0, self.local_step - self.job.interval)
        self._roll_back_to(restore)
        replaced = self._decide_all(self._events(failure))
        self._start(replaced)

    def _announced(self, failure: Failure) -> None:
        """Saved at the notice (one snapshot), then decided on, then restarted from the saved step."""
        self._stall(Category.CHECKPOINT_SAVE, self.costs.snapshot())
        self.local_step = int(self.steps)
        if not self._stop(failure.host, FaultKind.ANNOUNCED_LOSS, failure.category.name):
            return
        replaced = self._decide_all(self._events(failure))
        self._roll_back_to(self.local_step)
        self._start(replaced)

    def _stop(self, host: int, kind: FaultKind, detail: str) -> bool:
        """The stop through the real state machine; False when its rule failed the job."""
        world = self._world_hosts()
        event = machine.FaultStop(host, kind, detail, EPOCH + self.now, frozenset(world), world)
        self.state, _ = machine.transition(self.state, event, self.job.rule)
        return self.state.phase is JobState.STOPPING

    # --- decisions ----------------------------------------------------------------------------
    def _world(self) -> policy.World:
        shape = self.job.shape
        return policy.World(
            active_slices=tuple(sorted(self.active)),
            full_slices=shape.slices,
            min_slices=self.job.min_slices,
            hosts_per_slice=shape.hosts_per_slice,
            devices_per_host=shape.devices_per_host,
            restorable_slices=0,  # capacity coming back is offered as it comes (`_capacity_returned`)
        )

    def _decide(self, event: policy.Event) -> policy.Action:
        assert self.engine is not None and self.result is not None
        self._spares_back()
        decision, _ = self.engine.decide(
            event,
            now=EPOCH + self.now,
            step=int(self.steps),
            generation=self.state.generation,
            # As in a cluster (leader.capacity.PodReplacements): with no spare standing by, the
            # operator still makes a new machine for a host, only later.
            spares=self.spares or int(self.job.new_machines),
            scores={},
            world=self._world(),
        )
        self.result.decisions[decision.action.name] += 1
        return decision.action

    def _decide_all(self, events: list[policy.Event]) -> set[int]:
        """The policy's decisions on `events`, applied; the hosts handed to spares."""
        replaced: set[int] = set()
        for event in events:
            host = getattr(event, "host", None)
            if host is not None and self.job.shape.slice_of(host) not in self.active:
                continue  # its slice was dropped by the decision before (a whole slice lost)
            action = self._decide(event)
            if isinstance(action, policy.Wait):
                self._stall(Category.INFRASTRUCTURE_RECOVERY, action.seconds)
                action = self._decide(dataclasses.replace(event, t=EPOCH + self.now))
            if isinstance(action, policy.ReplaceHost) and self.spares > 0:
                self.spares -= 1
                self.spare_returns.append(self.now + self.costs.replacement_seconds)
                replaced.add(action.host)
            elif isinstance(action, policy.ReplaceHost):  # no spare standing by: a new machine is awaited
                self._stall(Category.INFRASTRUCTURE_RECOVERY, self.costs.replacement_seconds)
                replaced.add(action.host)
            elif isinstance(action, policy.ScaleDown) and host is not None:
                dropped = set(action.slices) or {self.job.shape.slice_of(host)}
                if len(self.active - dropped) >= self.job.min_slices:
                    self.active -= dropped
                    if self.job.new_machines:
                        self.slice_returns += [self.now + self.costs.replacement_seconds] * len(dropped)
                        self.slice_returns.sort()
            elif isinstance(action, policy.Fail):
                self.state, _ = machine.transition(self.state, machine.JobFails(action.reason), self.job.rule)
            elif isinstance(action, (policy.RestartInJob, policy.Ignore)):
                pass
        return replaced

    def _spares_back(self) -> None:
        while self.spare_returns and self.spare_returns[0] <= self.now:
            self.spare_returns.pop(0)
            self.spares += 1

    def _machine_back(self) -> None:
        """A machine joined: a dropped slice may come back with it, else it waits as a spare."""
        self.spares += 1
        if len(self.active) < self.job.shape.slices:
            self._capacity_returned()

    def _capacity_returned(self) -> None:
        """A dropped slice's machines are back: the policy may scale up (a planned stop)."""
        if self.engine is None or self.state.phase is not JobState.RUNNING:
            return
        event = policy.CapacityReturned(
            t=EPOCH + self.now, step=int(self.steps), generation=self.state.generation, spares=1
        )
        dropped = set(range(self.job.shape.slices)) - self.active
        if not dropped:
            return
        decision, _ = self.engine.decide(
            event,
            now=EPOCH + self.now,
            step=int(self.steps),
            generation=self.state.generation,
            spares=self.spares,
            scores={},
            world=dataclasses.replace(self._world(), restorable_slices=1),
        )
        assert self.result is not None
        self.result.decisions[decision.action.name] += 1
        if not isinstance(decision.action, policy.ScaleUp):
            return
        # A planned stop: the job trains on to its next checkpoint step and restarts from it.
        boundary = math.ceil(self.steps / self.job.interval) * self.job.interval
        self._train(self._seconds_to_step(boundary))
        self._set_steps(float(boundary))
        if not self.job.new_machines:
            self.spares = max(0, self.spares - 1)  # the joined machine stands in for the lost host
        world = self._world_hosts()
        stop = machine.FaultStop(
            0,
            FaultKind.CAPACITY_RETURNED,
            "scale-up",
            EPOCH + self.now,
            frozenset(world),
            world,
            planned=True,
        )
        self.state, _ = machine.transition(self.state, stop, self.job.rule)
        self._roll_back_to(self.local_step)
        self.active.add(min(dropped))
        self._start(set(self.job.shape.hosts_of(min(dropped))))

    # --- the restart --------------------------------------------------------------------------
    def _start(self, replaced: set[int]) -> None:
        """Every live host acked the stop; the next generation starts once the costs of a start are paid."""
        if self.state.phase is not JobState.STOPPING:
            return
        c = self.costs
        world = self._world_hosts()
        readiness = machine.Readiness(frozenset(world), world)
        self.state, commands = machine.transition(
            self.state, machine.StopAcked(frozenset(world), self.state.generation, readiness), self.job.rule
        )
        if not any(isinstance(command, machine.StartGeneration) for command in commands):
            return
        self._stall(Category.INFRASTRUCTURE_RECOVERY, c.restart_round(len(world)))
        self._stall(Category.TPU_INITIALIZATION, c.distributed_init_seconds)
        self._stall(Category.TRAINING_PREP, c.prep_seconds)
        rate = c.peer_gb_per_second if replaced else c.local_gb_per_second
        self._stall(Category.CHECKPOINT_RESTORE, c.restore(rate))
        key = tuple(sorted(self.active))
        first_time = key not in self.worlds_run
        self.worlds_run.add(key)
        self._stall(
            Category.PROGRAM_STARTUP, c.program_compile_seconds if first_time else c.program_load_seconds
        )
        self.state, _ = machine.replay(
            self.state, [machine.Started(self.state.generation + 1), machine.Progressed()], self.job.rule
        )

    def _restart_from_persistent(self, failure: Failure) -> None:
        """The baseline: every pod recreated (a lost machine waited for), every host restored from the
        persistent tier's newest checkpoint."""
        c = self.costs
        effect = failure.category.effect
        self._stall(Category.INFRASTRUCTURE_RECOVERY, max(self._detect(effect), c.lost_detect_seconds))
        if not self._stop(failure.host, FaultKind.HOST_LOST, failure.category.name):
            return
        restore = self.persistent_step
        if effect is Effect.CORRUPT:
            restore = max(0, restore - self.job.persistent_interval)
        self._roll_back_to(restore)
        wait = c.recreate_pods_seconds
        if effect in (Effect.HOST_LOST, Effect.MAINTENANCE):
            wait = max(wait, c.replacement_seconds)
        self._stall(Category.INFRASTRUCTURE_RECOVERY, wait)
        world = self._world_hosts()
        readiness = machine.Readiness(frozenset(world), world)
        self.state, _ = machine.transition(
            self.state, machine.StopAcked(frozenset(world), self.state.generation, readiness), self.job.rule
        )
        self._stall(Category.TPU_INITIALIZATION, c.distributed_init_seconds)
        self._stall(Category.TRAINING_PREP, c.prep_seconds)
        self._stall(Category.CHECKPOINT_RESTORE, c.restore(c.persistent_gb_per_second))
        self._stall(Category.PROGRAM_STARTUP, c.program_compile_seconds)
        self.state, _ = machine.replay(
            self.state, [machine.Started(self.state.generation + 1), machine.Progressed()], self.job.rule
        )


def young_interval_steps(costs: CostModel, failures_per_second: float) -> float:
    """Young's optimum checkpoint interval sqrt(2 C MTBF), in steps (C: the blocking save)."""
    if failures_per_second <= 0:
        return math.inf
    return math.sqrt(2 * costs.snapshot() / failures_per_second) / costs.step_seconds
