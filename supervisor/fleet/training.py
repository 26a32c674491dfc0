"""A simulated job's time and training: the clock, the steps done and the steps saved, and the
chip-seconds each stretch of time is booked to (the run's `Result`).

Training runs a step every step time of the world that trains, with a blocking save each time a
checkpoint step is passed; a stall (detection, a restart round, a restore) books its time to one
category; a roll-back moves the steps trained since a save from productive to wasted_progress. The
chips of dropped slices are booked to scaled_down meanwhile.
"""

from __future__ import annotations

import math

from slicekeeper.supervisor.fleet.cluster import Cluster
from slicekeeper.supervisor.fleet.outcome import Result, Setup

from slicekeeper.goodput import Category


class Training:
    def __init__(self, setup: Setup, cluster: Cluster, result: Result) -> None:
        self._setup = setup
        self._cluster = cluster
        self.result = result
        """What the run comes to: its chip-seconds are booked here."""
        self.now = 0.0
        self.steps = 0.0
        """Steps completed since the start (fractional: the step under way)."""
        self.local_step = 0
        """The newest step saved to the local tier."""
        self.persistent_step = 0
        """The newest step saved to the persistent tier."""

    def book(self, category: str, seconds: float, chips: int | None = None) -> None:
        """`seconds` of the active chips (or of `chips`) to `category`, the idle chips' to scaled_down."""
        active = self._cluster.active_chips()
        chips = active if chips is None else chips
        self.result.chip_seconds[category] += seconds * chips
        idle = self._setup.job.chips - active
        if idle and chips != self._setup.job.chips:
            self.result.chip_seconds[Category.SCALED_DOWN] += seconds * idle

    def stall(self, category: str, seconds: float) -> None:
        """`seconds` go by without training, booked to `category`."""
        self.book(category, seconds)
        self.now += seconds

    def train(self, seconds: float) -> None:
        """`seconds` of training: the steps they do productive, their saves checkpoint_save."""
        if seconds <= 0:
            return
        reached = self._steps_after(seconds)
        productive = (reached - self.steps) * self.step_seconds()
        self.book(Category.PRODUCTIVE, productive)
        self.book(Category.CHECKPOINT_SAVE, seconds - productive)
        self.set_steps(reached)
        self.now += seconds

    def set_steps(self, steps: float) -> None:
        """`steps` done, and the saves each tier holds by then."""
        job = self._setup.job
        self.steps = steps
        self.local_step = int(steps // job.interval) * job.interval
        self.persistent_step = int(steps // job.persistent_interval) * job.persistent_interval

    def roll_back_to(self, step: int) -> None:
        """Steps trained after `step` are thrown away: their time was wasted."""
        lost = max(0.0, self.steps - step) * self.step_seconds() * self._cluster.active_chips()
        self.result.chip_seconds[Category.PRODUCTIVE] -= lost
        self.result.chip_seconds[Category.WASTED_PROGRESS] += lost
        self.steps = float(step)

    def step_seconds(self) -> float:
        """The step time of the world that trains now."""
        return self._setup.step_seconds_by_slices.get(
            len(self._cluster.active), self._setup.costs.step_seconds
        )

    def _steps_after(self, seconds: float) -> float:
        """The steps done after training `seconds` from now: a step every step_seconds, a blocking
        save each time a checkpoint step is passed (not the one a restore started from)."""
        c, interval, done, step = self._setup.costs, self._setup.interval, self.steps, self.step_seconds()
        to_boundary = (math.floor(done / interval) + 1) * interval - done
        if seconds <= to_boundary * step:
            return done + seconds / step
        seconds -= to_boundary * step
        cycles, rest = divmod(seconds, c.snapshot() + interval * step)
        return done + to_boundary + cycles * interval + max(0.0, rest - c.snapshot()) / step

    def seconds_to_step(self, step: float) -> float:
        """How long training takes from now to `step` steps done (0 when they are)."""
        if step <= self.steps:
            return 0.0
        interval = self._setup.interval
        saves = max(0, math.ceil(step / interval) - 1 - math.floor(self.steps / interval))
        return (step - self.steps) * self.step_seconds() + saves * self._setup.costs.snapshot()
