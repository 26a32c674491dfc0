"""What this host makes of each event its workload's SDK sends.

The SDK socket's server (host.sdk_events) decides whose word counts and checks each event's fields;
here a checked event of the current generation takes effect: it feeds the hang detector (activity),
the culprit tracker (where the workload is), the goodput accountant (what the time is spent on) and
the metrics, the ones the leader needs are reported to it, and the served host's hooks are called
(the chaos faults' triggers, the tiers' committed step, the moment to pre-start the next standby).
Right after a restore, the first steps must give a finite loss, or the restored step is declared bad.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoint_vocabulary import Tier
from slicekeeper.supervisor.host.context import HostContext
from slicekeeper.supervisor.signals.culprit import ActivityTracker
from slicekeeper.supervisor.signals.hang import HangDetector

from slicekeeper.goodput import PHASE_CATEGORY
from slicekeeper.policy.events import FaultKind
from slicekeeper.protocol import Event, Phase

SANITY_STEPS = 3
"""Steps after a restore whose loss must be finite, or the restored step is declared bad."""

_STEP_EVENTS = (Event.PHASE, Event.STEP_BEGIN, Event.WORK_DONE, Event.STEP_END)


class StepBookkeeping:
    """The current generation's steps as this host counts them: whether its first step is still to
    come, when the next standby is due, and the sanity checks left after a restore. No clock, no I/O."""

    def __init__(self) -> None:
        self.first_pending = True
        """No step of this generation has ended yet: the next to begin is its first (goodput)."""
        self._standby_after: int | None = 0
        """Pre-start the standby once a step beyond this one ends (None: done for this generation)."""
        self._sanity_left = 0
        self.restored_step: int | None = None
        """The step this generation restored (None: from scratch)."""

    def begin(self, restore_step: int | None, high_water: int) -> None:
        """A generation starts from `restore_step`, this host having done steps up to `high_water`:
        its first step to come, the standby due after a step beyond `high_water`, no sanity check
        (yet)."""
        self.first_pending = True
        self._standby_after = high_water
        self.restored_step, self._sanity_left = restore_step, 0

    def check_restored(self) -> None:
        """The restore step was staged: the next SANITY_STEPS steps' losses must be finite."""
        self._sanity_left = SANITY_STEPS

    def ended(self, step: int) -> bool:
        """Step `step` ended; True once, at the end of the first step beyond what this host had done
        before the generation started: the moment to pre-start the next standby."""
        self.first_pending = False
        if self._standby_after is not None and step > self._standby_after:
            self._standby_after = None
            return True
        return False

    def condemns(self, loss: Any) -> bool:
        """Whether `loss`, a step's loss, condemns the restored step: not finite within the first
        steps after a restore (then no later step is checked)."""
        if self._sanity_left <= 0:
            return False
        self._sanity_left -= 1
        if loss is None or math.isfinite(float(loss)):
            return False
        self._sanity_left = 0
        return True


class EventEffects:
    """Each checked event of the current generation's workload, taking effect on this host; what the
    workload said that outlives the event (its `done`, its newest committed step)."""

    def __init__(
        self,
        context: HostContext,
        *,
        detector: HangDetector,
        activity: ActivityTracker,
        checkpoint_saved: Callable[[int], None],
        step_begun: Callable[[int], None],
        work_done: Callable[[int], None],
        productive_again: Callable[[], object],
    ) -> None:
        """The hooks as supervisor.host.sdk_events.SdkEvents describes them."""
        self._context = context
        self._detector = detector
        self._activity = activity
        self._checkpoint_saved = checkpoint_saved
        self._step_begun = step_begun
        self._work_done = work_done
        self._productive_again = productive_again
        self._steps = StepBookkeeping()
        self.done: dict[str, Any] | None = None
        """The current generation's `done` event: it finished training (its exit says the rest)."""
        self.fingerprint: str | None = None
        """The parameters' fingerprint of the newest `done`."""
        self.last_checkpoint: int | None = None
        """The newest committed local step."""

    def begin(self, restore_step: int | None, now: float, *, host_count: int) -> None:
        """A generation of `host_count` hosts starts from `restore_step`: a new process (the startup
        allowance applies again, then the first steps' allowance for its world), nothing done yet, its
        first step to come, no sanity check (yet)."""
        self._detector.restart(now, host_count=host_count)
        self._activity.restart(now, restore_step)
        self.done = None
        self._steps.begin(restore_step, self._context.accountant.high_water)

    def drop_checkpoints_after(self, restore_step: int | None) -> None:
        """The newest committed step is now the restore step (none: from scratch) if it was later."""
        if self.last_checkpoint is not None and (restore_step is None or self.last_checkpoint > restore_step):
            self.last_checkpoint = restore_step
            self._context.metrics.last_checkpoint_step.set(restore_step or 0)

    def check_restored_steps(self) -> None:
        self._steps.check_restored()

    async def take(self, event: Event, message: dict[str, Any], generation: int) -> None:
        """`message`, a checked `event` of generation `generation`'s workload, takes effect."""
        now = time.time()
        if event is Event.PHASE:
            phase = Phase(message["phase"])
            self._detector.activity(now, phase)
            self._activity.phase(now, phase.value)
            self._context.accountant.switch(PHASE_CATEGORY[phase], now)
        elif event is Event.STEP_BEGIN:
            step = int(message["step"])
            self._detector.activity(now, Phase.IDLE)
            self._activity.step_begun(now, step)
            self._context.accountant.begin_step(step, now, first_of_start=self._steps.first_pending)
            self._step_begun(step)
        elif event is Event.WORK_DONE:
            # Not activity for the hang timer: silence is counted from the step's begin on every host,
            # the one that stopped and the ones waiting for it alike; the leader tells them apart.
            self._activity.work_done(now, int(message["step"]))
            self._work_done(int(message["step"]))
        elif event is Event.STEP_END:
            if not await self._step_ended(now, int(message["step"]), message, generation):
                return
        elif event is Event.CHECKPOINT_SAVED:
            self._detector.activity(now)
            self.last_checkpoint = int(message["step"])
            self._context.metrics.last_checkpoint_step.set(self.last_checkpoint)
            self._checkpoint_saved(self.last_checkpoint)
            await self._context.report(messages.Committed(step=self.last_checkpoint))
        elif event is Event.CHECKPOINT_FAILED:
            await self._checkpoint_failed(now, message)
        elif event is Event.CHECKPOINT_RESTORED:
            self._detector.activity(now)
            # What the workload says it loaded, next to what this supervisor staged for it.
            await self._context.report(messages.Loaded(generation=generation, step=int(message["step"])))
        elif event is Event.DONE:
            self._detector.activity(now, Phase.TEARDOWN)  # it must still exit, within the phase allowance
            self.done = message
            self.fingerprint = message.get("fingerprint")
        else:
            self._detector.activity(now)
        if event not in _STEP_EVENTS:
            self._activity.other(now)

    async def _step_ended(self, now: float, step: int, message: dict[str, Any], generation: int) -> bool:
        """A step ended; False when its loss condemned the restored step (nothing more to do)."""
        self._activity.step_ended(now, step)
        duration = self._context.accountant.end_step(step, now)
        self._detector.step_completed(now, duration)
        if self._steps.ended(step):
            self._productive_again()
        if duration is not None:
            self._context.metrics.step_duration.observe(duration)
        if self._steps.condemns(message.get("loss")):
            await self._restored_state_is_bad(step, message.get("loss"), generation)
            return False
        self._context.metrics.steps.inc()
        self._context.metrics.step.set(step)
        await self._context.report(
            messages.Progress(
                generation=generation,
                step=step,
                loss=message.get("loss"),
                work=message.get("work"),
                core=message.get("core"),
            )
        )
        return True

    async def _checkpoint_failed(self, now: float, message: dict[str, Any]) -> None:
        self._detector.activity(now)
        during = message.get("during", "save")
        if during == "save":
            # The metric's labels are the tiers: a tier a workload makes up adds none (counted as local,
            # as the report below says).
            tier = message.get("tier")
            self._context.metrics.checkpoint_failures.labels(
                tier=tier if tier in set(Tier) else Tier.LOCAL
            ).inc()
        await self._context.report(
            messages.CheckpointInvalid(
                step=int(message["step"]),
                tier="local",
                reason="save failed" if during == "save" else "corrupt",
                detail=message.get("reason", ""),
            )
        )
        self._context.say(f"checkpoint of step {message['step']} failed: {message.get('reason')}")

    async def _restored_state_is_bad(self, step: int, loss: Any, generation: int) -> None:
        """A step right after a restore gave a non-finite loss: the restored step is bad."""
        restored = self._steps.restored_step
        detail = f"loss {loss} at step {step}, right after restoring step {restored}"
        await self._context.report(
            messages.Fault(
                generation=generation,
                kind=FaultKind.NONFINITE_LOSS,
                detail=detail,
                invalid_step=restored,
            )
        )
