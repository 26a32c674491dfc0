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
from dataclasses import dataclass, field

from slicekeeper.supervisor.fleet.costs import CostModel
from slicekeeper.supervisor.fleet.failures import Effect, Failure
from slicekeeper.supervisor.fleet.outcome import Job, Mode, Result
from slicekeeper.supervisor.fleet.policy_events import policy_events
from slicekeeper.supervisor.leader import restart_machine as machine
from slicekeeper.supervisor.leader.journal import JobState

from slicekeeper import policy
from slicekeeper.goodput import Category
from slicekeeper.policy.engine import PolicyEngine
from slicekeeper.policy.events import FaultKind

EPOCH = 1_800_000_000.0
"""Simulated time 0 as Unix time, for the policy's budget windows."""


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
    priced: bool = True
    """The policy is told what each remedy costs (context.expected_cost); False: the plain ladder."""
    keep_records: bool = False
    """Keep what a report lists: every decision with its context (the policy event log beside it),
    the worlds and the scale events with their slices."""
    _hosts_of_world: tuple[tuple[int, ...], tuple[int, ...], frozenset[int]] = ((), (), frozenset())

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
        self.result = Result(self.name, seconds, self.job.chips, keep_records=self.keep_records)
        for category, spent in (start if start is not None else self._first_start()).items():
            self._stall(category, spent)
        if self.keep_records:
            self.result.worlds.append(
                {
                    "t": self.now,
                    "step": 0,
                    "generation": 0,
                    "slices": sorted(self.active),
                    "hosts": self.job.shape.host_count,
                }
            )
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
            hosts = self.job.shape.hosts_in(key)
            self._hosts_of_world = (key, hosts, frozenset(hosts))
        return self._hosts_of_world[1]

    def _live(self) -> frozenset[int]:
        """The same hosts as a set: every one of them is connected (a lost one is replaced at once)."""
        self._world_hosts()
        return self._hosts_of_world[2]

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
        started, step = self.now, int(self.steps)
        if self.mode is Mode.PERSISTENT_RESTART:
            kind, detection = self._restart_from_persistent(failure)
        elif effect is Effect.MAINTENANCE:
            kind, detection = self._announced(failure)
        else:
            kind, detection = self._unannounced(failure)
        self.result.recoveries.setdefault(str(effect), []).append(self.now - started)
        resumed = None if self.state.over else self.now
        self.result.faults.append(
            {
                "kind": str(effect),
                "host": failure.host,
                "step": step,
                "fired_at": started,
                "detected_as": kind.value,
                "detected_at": started + detection,
                "resumed_at": resumed,
                "productive_at": None,
                "detection_seconds": round(detection, 3),
                "recovery_seconds": None if resumed is None else round(resumed - started - detection, 3),
                "detail": failure.category.name,
            }
        )

    def _detect(self, effect: Effect) -> float:
        c = self.costs
        return {
            Effect.CRASH: c.crash_detect_seconds,
            Effect.HANG: c.hang_detect(),
            Effect.HOST_LOST: c.lost_detect_seconds,
            Effect.CORRUPT: c.crash_detect_seconds,
        }.get(effect, 0.0)

    def _events_of(self, failure: Failure) -> list[policy.Event]:
        return policy_events(
            failure,
            self._hosts_hit(failure),
            t=EPOCH + self.now,
            step=int(self.steps),
            generation=self.state.generation,
            hang_seconds=self.costs.hang_detect(),
        )

    def _unannounced(self, failure: Failure) -> tuple[FaultKind, float]:
        """Detected, stopped, rolled back to the newest good save, decided on, restarted."""
        effect = failure.category.effect
        hit = self._hosts_hit(failure)
        detection = self._detect(effect)
        if effect is Effect.HOST_LOST and self.leader in hit:
            # The leader's machine: the others notice when its lease runs out, and one of them leads.
            detection = self.costs.leader_lost_detect_seconds
            self.leader = min((h for h in self._world_hosts() if h not in hit), default=self.leader)
        self._stall(Category.INFRASTRUCTURE_RECOVERY, detection)
        kind = FaultKind.CHECKPOINT_INVALID if effect is Effect.CORRUPT else FaultKind(str(effect))
        if not self._stop(failure.host, kind, failure.category.name):
            return kind, detection
        restore = self.local_step
        if effect is Effect.CORRUPT:  # the newest step holds the bad state too
            restore = max(0, self.local_step - self.job.interval)
        self._roll_back_to(restore)
        replaced = self._decide_all(self._events_of(failure))
        self._start(replaced)
        return kind, detection

    def _announced(self, failure: Failure) -> tuple[FaultKind, float]:
        """Saved at the notice (one snapshot), then decided on, then restarted from the saved step."""
        self._stall(Category.CHECKPOINT_SAVE, self.costs.snapshot())
        self.local_step = int(self.steps)
        if self._stop(failure.host, FaultKind.ANNOUNCED_LOSS, failure.category.name):
            replaced = self._decide_all(self._events_of(failure))
            self._roll_back_to(self.local_step)
            self._start(replaced)
        return FaultKind.ANNOUNCED_LOSS, 0.0

    def _stop(self, host: int, kind: FaultKind, detail: str) -> bool:
        """The stop through the real state machine; False when its rule failed the job."""
        world = self._world_hosts()
        event = machine.FaultStop(host, kind, detail, EPOCH + self.now, self._live(), world)
        self.state, _ = machine.transition(self.state, event, self.job.rule)
        assert self.result is not None
        self.result.restarts[kind.value] += 1
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
        decision, context = self.engine.decide(
            event,
            now=EPOCH + self.now,
            step=int(self.steps),
            generation=self.state.generation,
            # As in a cluster (leader.capacity.PodReplacements): with no spare standing by, the
            # operator still makes a new machine for a host, only later.
            spares=self.spares or int(self.job.new_machines),
            scores={},
            world=self._world(),
            costs=self._recovery_costs(),
        )
        self.result.decided(decision, context, step=int(self.steps), generation=self.state.generation)
        return decision.action

    def _recovery_costs(self) -> policy.RecoveryCosts | None:
        """The cost model's prices of the remedies now, for the policy's expected costs."""
        if not self.priced:
            return None
        c, hosts = self.costs, len(self._world_hosts())
        restart = (
            c.restart_round(hosts) + c.distributed_init_seconds + c.prep_seconds + c.program_load_seconds
        )
        return policy.RecoveryCosts(
            restart_seconds=restart + c.restore(c.local_gb_per_second),
            swap_seconds=restart + c.restore(c.peer_gb_per_second),
            replace_wait_seconds=0.0 if self.spares > 0 else c.replacement_seconds,
            compile_seconds=c.program_compile_seconds,
            capacity_return_seconds=c.replacement_seconds,
            lost_work_seconds=self.job.interval * self._step_seconds() / 2,
        )

    def _decide_all(self, events: list[policy.Event]) -> set[int]:
        """The policy's decisions on `events`, applied; the hosts handed to spares."""
        assert self.result is not None
        replaced: set[int] = set()
        for event in events:
            host = getattr(event, "host", None)
            if host is not None and self.job.shape.slice_of(host) not in self.active:
                continue  # its slice was dropped by the decision before (a whole slice lost)
            action = self._decide(event)
            if isinstance(action, policy.Wait):
                self._stall(Category.INFRASTRUCTURE_RECOVERY, action.seconds)
                action = self._decide(dataclasses.replace(event, t=EPOCH + self.now))
            if isinstance(action, policy.ReplaceHost):
                swap = len(self.result.hot_swaps)
                self.result.hot_swaps.append(
                    {
                        "host": action.host,
                        "spare": swap,
                        "machine": f"spare-{swap}" if self.spares > 0 else f"new-machine-{swap}",
                        "generation": self.state.generation,
                    }
                )
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
                    self._scaled("down", self.active - dropped, event.kind.value)
                    self.active -= dropped
                    if self.job.new_machines:
                        self.slice_returns += [self.now + self.costs.replacement_seconds] * len(dropped)
                        self.slice_returns.sort()
            elif isinstance(action, policy.Fail):
                self.state, _ = machine.transition(self.state, machine.JobFails(action.reason), self.job.rule)
            elif isinstance(action, (policy.RestartInJob, policy.Ignore)):
                pass
        return replaced

    def _scaled(self, kind: str, to: set[int], reason: str) -> None:
        assert self.result is not None
        if not self.keep_records:
            return
        per = self.job.shape.hosts_per_slice
        self.result.scale_events.append(
            {
                "t": self.now,
                "kind": kind,
                "step": int(self.steps),
                "generation": self.state.generation,
                "from_slices": sorted(self.active),
                "to_slices": sorted(to),
                "from_hosts": len(self.active) * per,
                "to_hosts": len(to) * per,
                "reason": reason,
            }
        )

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
        decision, context = self.engine.decide(
            event,
            now=EPOCH + self.now,
            step=int(self.steps),
            generation=self.state.generation,
            spares=self.spares,
            scores={},
            world=dataclasses.replace(self._world(), restorable_slices=1),
        )
        assert self.result is not None
        self.result.decided(decision, context, step=int(self.steps), generation=self.state.generation)
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
            self._live(),
            world,
            planned=True,
        )
        self.state, _ = machine.transition(self.state, stop, self.job.rule)
        self._roll_back_to(self.local_step)
        self._scaled("up", self.active | {min(dropped)}, "capacity_returned")
        self.active.add(min(dropped))
        self._start(set(self.job.shape.hosts_of(min(dropped))))

    # --- the restart --------------------------------------------------------------------------
    def _start(self, replaced: set[int]) -> None:
        """Every live host acked the stop; the next generation starts once the costs of a start are paid."""
        if self.state.phase is not JobState.STOPPING:
            return
        c = self.costs
        world = self._world_hosts()
        readiness = machine.Readiness(self._live(), world)
        self.state, commands = machine.transition(
            self.state, machine.StopAcked(self._live(), self.state.generation, readiness), self.job.rule
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
        self._started()

    def _restart_from_persistent(self, failure: Failure) -> tuple[FaultKind, float]:
        """The baseline: every pod recreated (a lost machine waited for), every host restored from the
        persistent tier's newest checkpoint."""
        c = self.costs
        effect = failure.category.effect
        detection = max(self._detect(effect), c.lost_detect_seconds)
        self._stall(Category.INFRASTRUCTURE_RECOVERY, detection)
        if not self._stop(failure.host, FaultKind.HOST_LOST, failure.category.name):
            return FaultKind.HOST_LOST, detection
        restore = self.persistent_step
        if effect is Effect.CORRUPT:
            restore = max(0, restore - self.job.persistent_interval)
        self._roll_back_to(restore)
        wait = c.recreate_pods_seconds
        if effect in (Effect.HOST_LOST, Effect.MAINTENANCE):
            wait = max(wait, c.replacement_seconds)
        self._stall(Category.INFRASTRUCTURE_RECOVERY, wait)
        world = self._world_hosts()
        readiness = machine.Readiness(self._live(), world)
        self.state, _ = machine.transition(
            self.state, machine.StopAcked(self._live(), self.state.generation, readiness), self.job.rule
        )
        self._stall(Category.TPU_INITIALIZATION, c.distributed_init_seconds)
        self._stall(Category.TRAINING_PREP, c.prep_seconds)
        self._stall(Category.CHECKPOINT_RESTORE, c.restore(c.persistent_gb_per_second))
        self._stall(Category.PROGRAM_STARTUP, c.program_compile_seconds)
        self._started()
        return FaultKind.HOST_LOST, detection

    def _started(self) -> None:
        """The next generation trains: the state machine hears it, the report's world its slices."""
        self.state, _ = machine.replay(
            self.state, [machine.Started(self.state.generation + 1), machine.Progressed()], self.job.rule
        )
        assert self.result is not None
        self.result.generations = self.state.generation + 1
        if not self.keep_records:
            return
        slices = sorted(self.active)
        if not self.result.worlds or self.result.worlds[-1]["slices"] != slices:
            self.result.worlds.append(
                {
                    "t": self.now,
                    "step": int(self.steps),
                    "generation": self.state.generation,
                    "slices": slices,
                    "hosts": len(slices) * self.job.shape.hosts_per_slice,
                }
            )


def young_interval_steps(costs: CostModel, failures_per_second: float) -> float:
    """Young's optimum checkpoint interval sqrt(2 C MTBF), in steps (C: the blocking save)."""
    if failures_per_second <= 0:
        return math.inf
    return math.sqrt(2 * costs.snapshot() / failures_per_second) / costs.step_seconds
