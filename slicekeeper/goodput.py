"""Goodput accounting: every second of a host's wall time goes to productive steps or a badput category.

Categories follow Google's ml-goodput-measurement vocabulary (REFERENCES sec. 4). The accountant is
an interval clock: the owner switches the current category as events arrive, and each switch closes
the open interval. One accountant per host, used by the supervisor (and later the simulator).

Rules, in one place:
- a step counts as productive only the first time the job completes it; a step executed again after
  a restore is `wasted_progress`;
- the first step of every (re)start includes compilation and counts as `program_startup`;
- time still open when a fault stops the workload (the hung or interrupted step, the wait for the
  fault to be detected) is `infrastructure_recovery`, as is the restart itself until the new process
  reports in; a host parked by a scale-down has no workload to stop, its idle time stays `scaled_down`.

Because a fault can take the open interval back, only closed intervals are settled
(`settled_seconds`): what a Prometheus counter may show, never to go down. An accountant given a
`booked` callable hands it each interval as it closes, with the category it was finally booked to:
the supervisor writes them to its event log, from which the run's page draws its badput bands.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from enum import StrEnum

from slicekeeper.protocol import Phase


class Category(StrEnum):
    PRODUCTIVE = "productive"
    TPU_INITIALIZATION = "tpu_initialization"
    TRAINING_PREP = "training_prep"
    PROGRAM_STARTUP = "program_startup"
    DATA_LOADING = "data_loading"
    CHECKPOINT_SAVE = "checkpoint_save"
    CHECKPOINT_RESTORE = "checkpoint_restore"
    WASTED_PROGRESS = "wasted_progress"
    INFRASTRUCTURE_RECOVERY = "infrastructure_recovery"
    SCALED_DOWN = "scaled_down"
    """A host of a slice the job dropped (elastic scale-down), idle until the slice comes back."""
    OTHER = "other"


BADPUT = [c for c in Category if c is not Category.PRODUCTIVE]

SETTLED_WHILE_OPEN = frozenset({Category.INFRASTRUCTURE_RECOVERY, Category.SCALED_DOWN})
"""Categories whose open interval no fault re-books (GoodputAccountant.interrupt): already recovery,
or a parked host with no workload to lose."""

PHASE_CATEGORY = {
    Phase.TPU_INITIALIZATION: Category.TPU_INITIALIZATION,
    Phase.TRAINING_PREP: Category.TRAINING_PREP,
    Phase.PROGRAM_STARTUP: Category.PROGRAM_STARTUP,
    Phase.DATA_LOADING: Category.DATA_LOADING,
    Phase.CHECKPOINT_SAVE: Category.CHECKPOINT_SAVE,
    Phase.CHECKPOINT_RESTORE: Category.CHECKPOINT_RESTORE,
    Phase.TEARDOWN: Category.OTHER,
    Phase.IDLE: Category.OTHER,
    Phase.HELD: Category.INFRASTRUCTURE_RECOVERY,
}
"""Where the time of each phase a workload reports goes."""


def ideal_step_seconds(durations: list[float]) -> float | None:
    """Mean of the step times not above median + 3 x MAD (REFERENCES sec. 4)."""
    if not durations:
        return None
    median = statistics.median(durations)
    mad = statistics.median(abs(d - median) for d in durations)
    kept = [d for d in durations if d <= median + 3 * mad]
    return statistics.fmean(kept)


Booked = Callable[[Category, float, float], None]
"""Told of each closed interval: its category, its start and its end (Unix seconds)."""


class GoodputAccountant:
    def __init__(
        self, start: float, category: Category = Category.PROGRAM_STARTUP, *, booked: Booked | None = None
    ) -> None:
        self.start = start
        self._booked = booked
        self._since = start
        self._current = category
        self._seconds = dict.fromkeys(Category, 0.0)
        self.high_water = 0
        """The highest step the job has completed (restored from or reported by the workload)."""
        self._step_started: float | None = None
        self.productive_step_seconds: list[float] = []

    @property
    def current(self) -> Category:
        return self._current

    def switch(self, category: Category, now: float) -> None:
        self._seconds[self._current] += max(0.0, now - self._since)
        if self._booked is not None and now > self._since:
            self._booked(self._current, self._since, now)
        self._current = category
        self._since = now

    def book_open(self, now: float) -> None:
        """Close the open interval at `now` and go on in the same category (the totals are unchanged):
        an account ending now tells `booked` of its last interval."""
        self.switch(self._current, now)

    def begin_step(self, step: int, now: float, *, first_of_start: bool) -> Category:
        if first_of_start:
            category = Category.PROGRAM_STARTUP
        elif step > self.high_water:
            category = Category.PRODUCTIVE
        else:
            category = Category.WASTED_PROGRESS
        self.switch(category, now)
        self._step_started = now
        return category

    def end_step(self, step: int, now: float) -> float | None:
        """Close the step; returns its duration."""
        duration = None if self._step_started is None else now - self._step_started
        if self._current is Category.PRODUCTIVE and duration is not None:
            self.productive_step_seconds.append(duration)
        self.high_water = max(self.high_water, step)
        self._step_started = None
        self.switch(Category.OTHER, now)
        return duration

    def interrupt(self, now: float) -> None:
        """The workload was stopped by a fault: the open interval was lost to the disruption."""
        if self._current not in SETTLED_WHILE_OPEN:
            self._current = Category.INFRASTRUCTURE_RECOVERY
        self._step_started = None
        self.switch(Category.INFRASTRUCTURE_RECOVERY, now)

    def seconds(self, now: float) -> dict[Category, float]:
        """Totals per category including the open interval."""
        totals = dict(self._seconds)
        totals[self._current] += max(0.0, now - self._since)
        return totals

    def settled_seconds(self, now: float) -> dict[Category, float]:
        """Totals no later event can take back: closed intervals, and the open one only when a fault
        could not re-book it (`SETTLED_WHILE_OPEN`). Each total only ever grows."""
        totals = dict(self._seconds)
        if self._current in SETTLED_WHILE_OPEN:
            totals[self._current] += max(0.0, now - self._since)
        return totals

    def goodput(self, now: float) -> float:
        wall = now - self.start
        return self.seconds(now)[Category.PRODUCTIVE] / wall if wall > 0 else 0.0
