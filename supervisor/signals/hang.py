"""Hang detection with a timeout that grows with what it times.

A hang is no event from the workload for longer than the allowance of what it is doing:
- from process start to the first completed step of a (re)start: `startupTimeoutSeconds`
  (imports, distributed initialization, restore, compilation);
- inside a reported non-step phase (checkpoint save or restore, data loading): `phaseTimeoutSeconds`;
- otherwise (in or between steps): max(`hangTimeoutFloorSeconds`, `hangTimeoutFactor` x the tail of
  the recent step times, their 95th percentile over the last 32 completed steps);
- and for the first WARMUP_STEPS steps after the first of a (re)start, at least
  `warmupTimeoutPerHostSeconds` x the hosts of the world (never more than the startup allowance).
The floor keeps a fast job from being declared hung by scheduling noise; the factor keeps a slow
job from waiting minutes (NCCL's default is 10) before anyone notices. The tail, not the median: a
job is hung when a step takes far longer than its slow steps, not than its typical one. The first
steps of a start are slower than the steady state by an amount that grows with the world (peers
connected on first use, the standbys' imports competing with them) and no step of this start has
been timed yet: the allowance per host covers them.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from slicekeeper.api import HealthSpec
from slicekeeper.protocol import Phase

_STEP_PHASES = {Phase.IDLE}

WARMUP_STEPS = 3
"""Steps after the first of a start that get the world's allowance: by then the start's own step
times are in the tail."""

TAIL_QUANTILE = 0.95
"""The step time the limit follows: this quantile of the recent steps (nearest rank)."""


@dataclass(frozen=True)
class Allowance:
    """Seconds of silence allowed right now, and what they rest on (said in a hang report)."""

    seconds: float
    basis: str


class HangDetector:
    def __init__(self, health: HealthSpec, window: int = 32) -> None:
        self._health = health
        self._durations: deque[float] = deque(maxlen=window)
        self._last_activity = 0.0
        self._phase = Phase.IDLE
        self._steps_this_start = 0
        self._host_count = 1

    def restart(self, now: float, *, host_count: int) -> None:
        """A new workload process starts in a world of `host_count` hosts: the startup allowance
        applies again, then the first steps' allowance."""
        self._last_activity = now
        self._phase = Phase.IDLE
        self._steps_this_start = 0
        self._host_count = host_count

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
    def last_activity(self) -> float:
        """When the workload last said anything: the silence is counted from here."""
        return self._last_activity

    @property
    def typical_step_seconds(self) -> float | None:
        """The median of the recent steps (the report's step time)."""
        return statistics.median(self._durations) if self._durations else None

    @property
    def tail_step_seconds(self) -> float | None:
        """The TAIL_QUANTILE of the recent steps: the slow steps the limit follows."""
        if not self._durations:
            return None
        ordered = sorted(self._durations)
        return ordered[math.ceil(TAIL_QUANTILE * len(ordered)) - 1]

    def allowance(self) -> Allowance:
        health = self._health
        if self._steps_this_start == 0:
            return Allowance(health.startup_timeout_seconds, "the startup allowance")
        if self._phase not in _STEP_PHASES:
            return Allowance(health.phase_timeout_seconds, f"the {self._phase.value} phase allowance")
        allowance = Allowance(health.hang_timeout_floor_seconds, "the floor")
        tail = self.tail_step_seconds
        if tail is not None and health.hang_timeout_factor * tail > allowance.seconds:
            allowance = Allowance(
                health.hang_timeout_factor * tail,
                f"{health.hang_timeout_factor:g} x the recent steps' p95 of {tail:.2f} s",
            )
        if self._steps_this_start <= WARMUP_STEPS:
            first_steps = min(
                health.startup_timeout_seconds, health.warmup_timeout_per_host_seconds * self._host_count
            )
            if first_steps > allowance.seconds:
                allowance = Allowance(first_steps, f"the first steps' allowance for {self._host_count} hosts")
        return allowance

    def limit(self) -> float:
        """Seconds of silence allowed right now."""
        return self.allowance().seconds

    def silent_for(self, now: float) -> float:
        return now - self._last_activity

    def hung(self, now: float) -> bool:
        return self.silent_for(now) > self.limit()
