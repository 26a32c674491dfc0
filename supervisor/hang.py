"""Hang detection with a timeout derived from observed step times.

A hang is no event from the workload for longer than the allowance of what it is doing:
- from process start to the first completed step of a (re)start: `startupTimeoutSeconds`
  (imports, distributed initialization, restore, compilation);
- inside a reported non-step phase (checkpoint save or restore, data loading): `phaseTimeoutSeconds`;
- otherwise (in or between steps): max(`hangTimeoutFloorSeconds`, `hangTimeoutFactor` x typical
  step time), the typical step time being the median of the last 32 completed steps.
The floor keeps a fast job from being declared hung by scheduling noise; the factor keeps a slow
job from waiting minutes (NCCL's default is 10) before anyone notices.
"""

from __future__ import annotations

import statistics
from collections import deque

from slicekeeper.api import HealthSpec
from slicekeeper.protocol import Phase

_STEP_PHASES = {Phase.IDLE}


class HangDetector:
    def __init__(self, health: HealthSpec, window: int = 32) -> None:
        self._health = health
        self._durations: deque[float] = deque(maxlen=window)
        self._last_activity = 0.0
        self._phase = Phase.IDLE
        self._steps_this_start = 0

    def restart(self, now: float) -> None:
        """A new workload process starts: the startup allowance applies again."""
        self._last_activity = now
        self._phase = Phase.IDLE
        self._steps_this_start = 0

    def activity(self, now: float, phase: Phase | None = None) -> None:
        self._last_activity = now
        if phase is not None:
            self._phase = phase

    def step_completed(self, now: float, duration: float | None) -> None:
        self._last_activity = now
        self._steps_this_start += 1
        # The first step of a start includes compilation: not a typical step.
        if duration is not None and self._steps_this_start > 1:
            self._durations.append(duration)

    @property
    def typical_step_seconds(self) -> float | None:
        return statistics.median(self._durations) if self._durations else None

    def limit(self) -> float:
        """Seconds of silence allowed right now."""
        if self._steps_this_start == 0:
            return self._health.startup_timeout_seconds
        if self._phase not in _STEP_PHASES:
            return self._health.phase_timeout_seconds
        typical = self.typical_step_seconds
        step_limit = self._health.hang_timeout_factor * typical if typical is not None else 0.0
        return max(self._health.hang_timeout_floor_seconds, step_limit)

    def silent_for(self, now: float) -> float:
        return now - self._last_activity

    def hung(self, now: float) -> bool:
        return self.silent_for(now) > self.limit()
