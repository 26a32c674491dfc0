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

A run's parts: what it simulates and how (supervisor.fleet.outcome.Setup, fixed), the cluster under
the job (supervisor.fleet.cluster: slices, spares, what comes back), the job's time, steps and
accounting (supervisor.fleet.training), and the restart state; `Simulation` takes each failure
through them.

Simplifications (docs/simulator.md): a failure that comes during a recovery is taken when the job
trains again; a straggler is not simulated; an announced loss is saved for at its notice.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from slicekeeper.supervisor.fleet.cluster import Cluster
from slicekeeper.supervisor.fleet.costs import CostModel
from slicekeeper.supervisor.fleet.failures import Effect, Failure
from slicekeeper.supervisor.fleet.outcome import Job, Mode, Result, Setup
from slicekeeper.supervisor.fleet.policy_events import policy_events
from slicekeeper.supervisor.fleet.training import Training
from slicekeeper.supervisor.leader import restart_events
from slicekeeper.supervisor.leader import restart_machine as machine
from slicekeeper.supervisor.leader.restart_state import JobState, Readiness, RestartState

from slicekeeper import policy
from slicekeeper.goodput import Category
from slicekeeper.policy.engine import PolicyEngine
from slicekeeper.policy.events import FaultKind

EPOCH = 1_800_000_000.0
"""Simulated time 0 as Unix time, for the policy's budget windows."""


class Simulation:
    """One run: the job trains on the simulated cluster, each failure of the schedule is detected,
    stopped through the restart state machine, decided on by the policy and restarted."""

    def __init__(
        self,
        job: Job,
        costs: CostModel,
        engine: PolicyEngine | None,
        *,
        mode: Mode = Mode.SLICEKEEPER,
        name: str = "slicekeeper",
        step_seconds_by_slices: Mapping[int, float] | None = None,
        priced: bool = True,
        keep_records: bool = False,
    ) -> None:
        self.setup = Setup(
            job,
            costs,
            engine,
            mode=mode,
            name=name,
            step_seconds_by_slices=step_seconds_by_slices or {},
            priced=priced,
            keep_records=keep_records,
        )
        self.cluster = Cluster(job)
        # The result's span is set by `run`, which is given it.
        self.training = Training(
            self.setup, self.cluster, Result(name, 0.0, job.chips, keep_records=keep_records)
        )
        self.state, _ = machine.replay(
            RestartState(), [restart_events.AllRegistered(), restart_events.Started(0)], job.rule
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
        training, result = self.training, self.training.result
        result.seconds = seconds
        for category, spent in (start if start is not None else self._first_start()).items():
            training.stall(category, spent)
        if self.setup.keep_records:
            result.worlds.append(
                {
                    "t": training.now,
                    "step": 0,
                    "generation": 0,
                    "slices": sorted(self.cluster.active),
                    "hosts": self.setup.job.shape.host_count,
                }
            )
        for failure in failures:
            if self.state.over:
                break
            if failure.step is not None:  # just before the step it came in
                if until_step is not None and failure.step > until_step:
                    break
                self._train_to_step(failure.step - 1, seconds)
                if training.now >= seconds:
                    break
            else:
                if (
                    until_step is not None
                    and training.now + training.seconds_to_step(until_step) <= failure.t
                ):
                    break
                self._train_until(min(failure.t, seconds), seconds)
                if failure.t >= seconds:
                    break
            self._fail(failure)
        if until_step is not None and not self.state.over:
            self._train_to_step(until_step, seconds)
            training.stall(Category.OTHER, max(0.0, min(end_seconds, seconds - training.now)))
            result.seconds = training.now
        elif not self.state.over:
            self._train_until(seconds, seconds)
        if self.state.phase is JobState.FAILED and training.now < seconds:
            if until_step is None:
                result.chip_seconds[Category.OTHER] += (seconds - training.now) * self.setup.job.chips
            else:
                result.seconds = training.now
            result.failure_reason = self.state.failure_reason
        result.steps = training.steps
        return result

    def _first_start(self) -> dict[str, float]:
        c = self.setup.costs
        return {
            Category.TPU_INITIALIZATION: c.distributed_init_seconds,
            Category.TRAINING_PREP: c.prep_seconds,
            Category.PROGRAM_STARTUP: c.program_compile_seconds,
        }

    # --- training -----------------------------------------------------------------------------
    def _train_until(self, until: float, end: float) -> None:
        """Train from now to `until` (capacity coming back on the way is offered to the policy)."""
        returns = self.cluster.slice_returns
        while returns and returns[0] <= until and not self.state.over:
            back = returns.pop(0)
            self.training.train(back - self.training.now)
            self._capacity_returned()
        self.training.train(until - self.training.now)

    def _train_to_step(self, step: int, end: float) -> None:
        """Train until the job has done `step` steps (or `end` comes), capacity coming back on the way
        offered to the policy (a scale-up goes back to a checkpoint: the target is reached later)."""
        training, returns = self.training, self.cluster.slice_returns
        while not self.state.over and training.steps < step and training.now < end:
            until = min(end, training.now + training.seconds_to_step(step))
            if returns and returns[0] <= until:
                self._train_until(returns[0], end)
                continue
            training.train(until - training.now)
            if until < end:
                training.set_steps(float(step))  # exact: no rounding left over

    # --- a failure ----------------------------------------------------------------------------
    def _hosts_hit(self, failure: Failure) -> list[int]:
        return self.cluster.hosts_hit(failure.host, whole_slice=failure.category.whole_slice)

    def _fail(self, failure: Failure) -> None:
        result, shape = self.training.result, self.setup.job.shape
        effect = failure.category.effect
        if effect is not Effect.CAPACITY and shape.slice_of(failure.host) not in self.cluster.active:
            return  # a machine of a dropped slice: nothing trains there
        if effect is Effect.CAPACITY:
            self._machine_back()
            return
        result.failures += 1
        started, step = self.training.now, int(self.training.steps)
        if self.setup.mode is Mode.PERSISTENT_RESTART:
            kind, detection = self._restart_from_persistent(failure)
        elif effect is Effect.MAINTENANCE:
            kind, detection = self._announced(failure)
        else:
            kind, detection = self._unannounced(failure)
        result.recoveries.setdefault(str(effect), []).append(self.training.now - started)
        resumed = None if self.state.over else self.training.now
        result.faults.append(
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
        c = self.setup.costs
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
            t=EPOCH + self.training.now,
            step=int(self.training.steps),
            generation=self.state.generation,
            hang_seconds=self.setup.costs.hang_detect(),
        )

    def _unannounced(self, failure: Failure) -> tuple[FaultKind, float]:
        """Detected, stopped, rolled back to the newest good save, decided on, restarted."""
        training = self.training
        effect = failure.category.effect
        hit = self._hosts_hit(failure)
        detection = self._detect(effect)
        if effect is Effect.HOST_LOST and self.cluster.leader in hit:
            # The leader's machine: the others notice when its lease runs out, one of them leads, and
            # every host registers again with it before it can restart the job.
            costs = self.setup.costs
            detection = costs.leader_lost_detect_seconds + costs.handover.at(len(self.cluster.live()))
            self.cluster.leader_lost(hit)
        training.stall(Category.INFRASTRUCTURE_RECOVERY, detection)
        kind = FaultKind.CHECKPOINT_INVALID if effect is Effect.CORRUPT else FaultKind(str(effect))
        if not self._stop(failure.host, kind, failure.category.name):
            return kind, detection
        restore = training.local_step
        if effect is Effect.CORRUPT:  # the newest step holds the bad state too
            restore = max(0, training.local_step - self.setup.job.interval)
        training.roll_back_to(restore)
        replaced = self._decide_all(self._events_of(failure))
        self._start(replaced)
        return kind, detection

    def _announced(self, failure: Failure) -> tuple[FaultKind, float]:
        """Saved at the notice (one snapshot), then decided on, then restarted from the saved step."""
        training = self.training
        training.stall(Category.CHECKPOINT_SAVE, self.setup.costs.snapshot())
        training.local_step = int(training.steps)
        if self._stop(failure.host, FaultKind.ANNOUNCED_LOSS, failure.category.name):
            replaced = self._decide_all(self._events_of(failure))
            training.roll_back_to(training.local_step)
            self._start(replaced)
        return FaultKind.ANNOUNCED_LOSS, 0.0

    def _stop(self, host: int, kind: FaultKind, detail: str) -> bool:
        """The stop through the real state machine; False when its rule failed the job."""
        world = self.cluster.world_hosts()
        event = restart_events.FaultStop(
            host, kind, detail, EPOCH + self.training.now, self.cluster.live(), world
        )
        self.state, _ = machine.transition(self.state, event, self.setup.job.rule)
        self.training.result.restarts[kind.value] += 1
        return self.state.phase is JobState.STOPPING

    # --- decisions ----------------------------------------------------------------------------
    def _world(self) -> policy.World:
        job = self.setup.job
        shape = job.shape
        return policy.World(
            active_slices=tuple(sorted(self.cluster.active)),
            full_slices=shape.slices,
            min_slices=job.min_slices,
            hosts_per_slice=shape.hosts_per_slice,
            devices_per_host=shape.devices_per_host,
            restorable_slices=0,  # capacity coming back is offered as it comes (`_capacity_returned`)
        )

    def _decide(self, event: policy.Event) -> policy.Action:
        engine, training = self.setup.engine, self.training
        assert engine is not None
        self.cluster.spares_back(training.now)
        decision, context = engine.decide(
            event,
            now=EPOCH + training.now,
            step=int(training.steps),
            generation=self.state.generation,
            # As in a cluster (leader.capacity.PodReplacements): with no spare standing by, the
            # operator still makes a new machine for a host, only later.
            spares=self.cluster.spares or int(self.setup.job.new_machines),
            scores={},
            world=self._world(),
            costs=self._recovery_costs(),
        )
        training.result.decided(decision, context, step=int(training.steps), generation=self.state.generation)
        return decision.action

    def _recovery_costs(self) -> policy.RecoveryCosts | None:
        """The cost model's prices of the remedies now, for the policy's expected costs."""
        if not self.setup.priced:
            return None
        c, hosts = self.setup.costs, len(self.cluster.world_hosts())
        restart = (
            c.restart_round.at(hosts) + c.distributed_init_seconds + c.prep_seconds + c.program_load_seconds
        )
        return policy.RecoveryCosts(
            restart_seconds=restart + c.restore(c.local_gb_per_second),
            swap_seconds=restart + c.restore(c.peer_gb_per_second),
            replace_wait_seconds=0.0 if self.cluster.spares > 0 else c.replacement_seconds,
            compile_seconds=c.program_compile_seconds,
            capacity_return_seconds=c.replacement_seconds,
            lost_work_seconds=self.setup.job.interval * self.training.step_seconds() / 2,
        )

    def _decide_all(self, events: list[policy.Event]) -> set[int]:
        """The policy's decisions on `events`, applied; the hosts handed to spares."""
        cluster, training, job, costs = self.cluster, self.training, self.setup.job, self.setup.costs
        replaced: set[int] = set()
        for event in events:
            host = getattr(event, "host", None)
            if host is not None and job.shape.slice_of(host) not in cluster.active:
                continue  # its slice was dropped by the decision before (a whole slice lost)
            action = self._decide(event)
            if isinstance(action, policy.Wait):
                training.stall(Category.INFRASTRUCTURE_RECOVERY, action.seconds)
                action = self._decide(dataclasses.replace(event, t=EPOCH + training.now))
            if isinstance(action, policy.ReplaceHost):
                swap = len(training.result.hot_swaps)
                training.result.hot_swaps.append(
                    {
                        "host": action.host,
                        "spare": swap,
                        "machine": f"spare-{swap}" if cluster.spares > 0 else f"new-machine-{swap}",
                        "generation": self.state.generation,
                    }
                )
            if isinstance(action, policy.ReplaceHost) and cluster.spares > 0:
                cluster.spares -= 1
                cluster.spare_returns.append(training.now + costs.replacement_seconds)
                replaced.add(action.host)
            elif isinstance(action, policy.ReplaceHost):  # no spare standing by: a new machine is awaited
                training.stall(Category.INFRASTRUCTURE_RECOVERY, costs.replacement_seconds)
                replaced.add(action.host)
            elif isinstance(action, policy.ScaleDown) and host is not None:
                dropped = set(action.slices) or {job.shape.slice_of(host)}
                if len(cluster.active - dropped) >= job.min_slices:
                    self._scaled("down", cluster.active - dropped, event.kind.value)
                    cluster.active -= dropped
                    if job.new_machines:
                        cluster.slice_returns += [training.now + costs.replacement_seconds] * len(dropped)
                        cluster.slice_returns.sort()
            elif isinstance(action, policy.Fail):
                self.state, _ = machine.transition(
                    self.state, restart_events.JobFails(action.reason), job.rule
                )
            elif isinstance(action, (policy.RestartInJob, policy.Ignore)):
                pass
        return replaced

    def _scaled(self, kind: str, to: set[int], reason: str) -> None:
        if not self.setup.keep_records:
            return
        per = self.setup.job.shape.hosts_per_slice
        active = self.cluster.active
        self.training.result.scale_events.append(
            {
                "t": self.training.now,
                "kind": kind,
                "step": int(self.training.steps),
                "generation": self.state.generation,
                "from_slices": sorted(active),
                "to_slices": sorted(to),
                "from_hosts": len(active) * per,
                "to_hosts": len(to) * per,
                "reason": reason,
            }
        )

    def _machine_back(self) -> None:
        """A machine joined: a dropped slice may come back with it, else it waits as a spare."""
        self.cluster.spares += 1
        if len(self.cluster.active) < self.setup.job.shape.slices:
            self._capacity_returned()

    def _capacity_returned(self) -> None:
        """A dropped slice's machines are back: the policy may scale up (a planned stop)."""
        engine, cluster, training, job = self.setup.engine, self.cluster, self.training, self.setup.job
        if engine is None or self.state.phase is not JobState.RUNNING:
            return
        event = policy.CapacityReturned(
            t=EPOCH + training.now, step=int(training.steps), generation=self.state.generation, spares=1
        )
        dropped = set(range(job.shape.slices)) - cluster.active
        if not dropped:
            return
        decision, context = engine.decide(
            event,
            now=EPOCH + training.now,
            step=int(training.steps),
            generation=self.state.generation,
            spares=cluster.spares,
            scores={},
            world=dataclasses.replace(self._world(), restorable_slices=1),
        )
        training.result.decided(decision, context, step=int(training.steps), generation=self.state.generation)
        if not isinstance(decision.action, policy.ScaleUp):
            return
        # A planned stop: the job trains on to its next checkpoint step and restarts from it.
        boundary = math.ceil(training.steps / job.interval) * job.interval
        training.train(training.seconds_to_step(boundary))
        training.set_steps(float(boundary))
        if not job.new_machines:
            cluster.spares = max(0, cluster.spares - 1)  # the joined machine stands in for the lost host
        world = cluster.world_hosts()
        stop = restart_events.FaultStop(
            0,
            FaultKind.CAPACITY_RETURNED,
            "scale-up",
            EPOCH + training.now,
            cluster.live(),
            world,
            planned=True,
        )
        self.state, _ = machine.transition(self.state, stop, job.rule)
        training.roll_back_to(training.local_step)
        self._scaled("up", cluster.active | {min(dropped)}, "capacity_returned")
        cluster.active.add(min(dropped))
        self._start(set(job.shape.hosts_of(min(dropped))))

    # --- the restart --------------------------------------------------------------------------
    def _start(self, replaced: set[int]) -> None:
        """Every live host acked the stop; the next generation starts once the costs of a start are paid."""
        if self.state.phase is not JobState.STOPPING:
            return
        c, training = self.setup.costs, self.training
        world = self.cluster.world_hosts()
        live = self.cluster.live()
        readiness = Readiness(live, world)
        self.state, commands = machine.transition(
            self.state, restart_events.StopAcked(live, self.state.generation, readiness), self.setup.job.rule
        )
        if not any(isinstance(command, restart_events.StartGeneration) for command in commands):
            return
        training.stall(Category.INFRASTRUCTURE_RECOVERY, c.restart_round.at(len(world)))
        training.stall(Category.TPU_INITIALIZATION, c.distributed_init_seconds)
        training.stall(Category.TRAINING_PREP, c.prep_seconds)
        rate = c.peer_gb_per_second if replaced else c.local_gb_per_second
        training.stall(Category.CHECKPOINT_RESTORE, c.restore(rate))
        first_time = self.cluster.first_run()
        training.stall(
            Category.PROGRAM_STARTUP, c.program_compile_seconds if first_time else c.program_load_seconds
        )
        self._started()

    def _restart_from_persistent(self, failure: Failure) -> tuple[FaultKind, float]:
        """The baseline: every pod recreated (a lost machine waited for), every host restored from the
        persistent tier's newest checkpoint."""
        c, training = self.setup.costs, self.training
        effect = failure.category.effect
        detection = max(self._detect(effect), c.lost_detect_seconds)
        training.stall(Category.INFRASTRUCTURE_RECOVERY, detection)
        if not self._stop(failure.host, FaultKind.HOST_LOST, failure.category.name):
            return FaultKind.HOST_LOST, detection
        restore = training.persistent_step
        if effect is Effect.CORRUPT:
            restore = max(0, restore - self.setup.job.persistent_interval)
        training.roll_back_to(restore)
        wait = c.recreate_pods_seconds
        if effect in (Effect.HOST_LOST, Effect.MAINTENANCE):
            wait = max(wait, c.replacement_seconds)
        training.stall(Category.INFRASTRUCTURE_RECOVERY, wait)
        world = self.cluster.world_hosts()
        live = self.cluster.live()
        readiness = Readiness(live, world)
        self.state, _ = machine.transition(
            self.state, restart_events.StopAcked(live, self.state.generation, readiness), self.setup.job.rule
        )
        training.stall(Category.TPU_INITIALIZATION, c.distributed_init_seconds)
        training.stall(Category.TRAINING_PREP, c.prep_seconds)
        training.stall(Category.CHECKPOINT_RESTORE, c.restore(c.persistent_gb_per_second))
        training.stall(Category.PROGRAM_STARTUP, c.program_compile_seconds)
        self._started()
        return FaultKind.HOST_LOST, detection

    def _started(self) -> None:
        """The next generation trains: the state machine hears it, the report's world its slices."""
        self.state, _ = machine.replay(
            self.state,
            [restart_events.Started(self.state.generation + 1), restart_events.Progressed()],
            self.setup.job.rule,
        )
        result = self.training.result
        result.generations = self.state.generation + 1
        if not self.setup.keep_records:
            return
        slices = sorted(self.cluster.active)
        if not result.worlds or result.worlds[-1]["slices"] != slices:
            result.worlds.append(
                {
                    "t": self.training.now,
                    "step": int(self.training.steps),
                    "generation": self.state.generation,
                    "slices": slices,
                    "hosts": len(slices) * self.setup.job.shape.hosts_per_slice,
                }
            )


def young_interval_steps(costs: CostModel, failures_per_second: float) -> float:
    """Young's optimum checkpoint interval sqrt(2 C MTBF), in steps (C: the blocking save)."""
    if failures_per_second <= 0:
        return math.inf
    return math.sqrt(2 * costs.snapshot() / failures_per_second) / costs.step_seconds
