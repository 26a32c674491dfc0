"""Chaos `slow`: make a workload's process group F times slower by duty cycling it.

A real straggler (a throttled chip, a failing fan, a noisy neighbour) does the same work in more
wall time. The supervisor reproduces that from the outside, without the workload's cooperation: in
every `period` the group runs for period/F, is stopped (SIGSTOP) for the rest, then continued
(SIGCONT). Over many periods the group gets 1/F of the wall clock, so work that spans several periods
takes about F times longer. The period is a compromise between two limits:
- not too long: work much shorter than a period sees either no pause or a whole one, so the period
  should stay below the step's own work (the default 50 ms suits steps of a quarter second and more);
  the straggler detector's median over a window smooths what is left;
- not too short: when other processes compete for the CPU (four hosts on a two-core machine), the
  kernel's fair scheduler repays a task that was stopped some of the CPU time it missed, a few
  milliseconds per stop, so many short stops are largely repaid and the slowdown shrinks below F.
  Measured on this two-core machine under heavy load (load average 7 to 10), as CPU time against an
  unthrottled twin: factor 2 with a 10 ms period 1.1-1.5x, with 50 ms 1.5-2.6x, with 200 ms
  2.4-3.4x; factor 1.5 with 50 ms 1.2-1.6x. Under contention, prefer the longest period the step's
  work allows (e.g. a third of the typical own work, between 50 and 200 ms).

The throttle acts on the process group the supervisor started (`WorkloadProcess.pid` is the group id,
the workload runs in a session of its own), so processes the workload spawned slow down too. It is
per process: a restarted workload is a new group and needs a new throttle.

`stop()` always leaves the group continued, whatever the phase it interrupted. A `hang` fault SIGSTOPs
the workload on purpose: stop the throttle with `stop(resume=False)` first, or a throttle still
running would continue the hung workload at its next period. A group that is gone (the workload
exited or was killed) ends the throttle quietly.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal


class Throttle:
    def __init__(self, pgid: int, factor: float, period: float = 0.05) -> None:
        if not math.isfinite(factor) or factor <= 1.0:
            raise ValueError(f"a throttle slows down: factor must be a finite number > 1, not {factor}")
        if not period > 0.0:
            raise ValueError(f"period must be positive, not {period}")
        self.pgid = pgid
        self.factor = factor
        self.period = period
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        """Cycling now: started, not stopped, and the group still exists."""
        return self._task is not None and not self._task.done()

    @property
    def run_seconds(self) -> float:
        """How long the group runs in each period."""
        return self.period / self.factor

    def start(self) -> None:
        """Begin cycling (from a running event loop); a second call while running does nothing."""
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(self._cycle(), name=f"throttle-{self.pgid}")

    async def stop(self, *, resume: bool = True) -> None:
        """Stop cycling. With `resume` (the default) the group is continued, so it is never left
        stopped; `resume=False` leaves it as the last cycle did (running or stopped), for a caller
        that stops it on purpose next (chaos `hang`)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if resume:
            self._signal(signal.SIGCONT)

    async def _cycle(self) -> None:
        # Deadlines, not durations: a late wake-up shortens the next phase instead of drifting. After
        # falling more than a period behind (a busy event loop), start afresh rather than catch up
        # with a burst of signals.
        loop = asyncio.get_running_loop()
        cycle_start = loop.time()
        try:
            while True:
                await asyncio.sleep(max(0.0, cycle_start + self.run_seconds - loop.time()))
                os.killpg(self.pgid, signal.SIGSTOP)
                cycle_start += self.period
                await asyncio.sleep(max(0.0, cycle_start - loop.time()))
                os.killpg(self.pgid, signal.SIGCONT)
                if loop.time() - cycle_start > self.period:
                    cycle_start = loop.time()
        except ProcessLookupError:
            return  # the group is gone: nothing left to slow down

    def _signal(self, signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signum)
