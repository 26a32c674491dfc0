"""The leader's one way to run work in the background: tasks and timers that can neither fail unseen
nor act for a leader that is no longer sure to lead.

A leader answers members while other work goes on: naming a hang's culprit, deciding on a straggler,
reconsidering after a policy's `Wait`, the deadline for stop acknowledgements, a replacement pod's
timeout. Each runs here. When one raises, the traceback is logged, the failure is counted by what
failed (`slicekeeper_leader_task_failures_total{task}`), and `failed` turns it into an outcome the job
can see (the leader fails the job with the reason): a job never waits for work that died.

A timer's work is fenced: it runs only while the leader still surely holds the job's lease, so a
leader paused past its lease and resumed does nothing its successor may already have done.
"""

from __future__ import annotations

import asyncio
import sys
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

Work = Coroutine[Any, Any, None]


class BackgroundWork:
    def __init__(
        self,
        *,
        leading: Callable[[], bool],
        failed: Callable[[str, BaseException], Awaitable[None]],
    ) -> None:
        self._leading = leading
        self._failed = failed
        """What a failure becomes (`task`: what failed, the exception): the leader fails the job."""
        self.failures: Counter[str] = Counter()
        """Failed background work, by what it was."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._timers: set[asyncio.TimerHandle] = set()

    def spawn(self, task: str, work: Work) -> asyncio.Task[None]:
        """Run `work` (`task`: what it is, for the log, the metric and the job's failure reason)."""
        running = asyncio.ensure_future(work)
        self._tasks.add(running)
        running.add_done_callback(lambda done: self._ended(task, done))
        return running

    def later(self, seconds: float, task: str, work: Callable[[], Work]) -> asyncio.TimerHandle:
        """Run `work()` in `seconds`, if this leader still leads then; cancel with the handle."""

        def fire() -> None:
            self._timers.discard(handle)
            if self._leading():
                self.spawn(task, work())

        handle = asyncio.get_running_loop().call_later(seconds, fire)
        self._timers.add(handle)
        return handle

    def _ended(self, task: str, done: asyncio.Task[None]) -> None:
        self._tasks.discard(done)
        if done.cancelled():
            return
        error = done.exception()
        if error is None:
            return
        if task == OUTCOME:
            self._count_and_log(task, error)  # the outcome itself failed: nothing further to turn to
        else:
            self.spawn(OUTCOME, self.failed(task, error))

    async def failed(self, task: str, error: BaseException) -> None:
        """`task` raised `error` (in the background or where it was awaited): log it, count it, and
        turn it into the job's outcome."""
        self._count_and_log(task, error)
        await self._failed(task, error)

    def _count_and_log(self, task: str, error: BaseException) -> None:
        self.failures[task] += 1
        trace = "".join(traceback.format_exception(error))
        print(f"leader: {task} failed:\n{trace}", file=sys.stderr, flush=True)

    def cancel(self) -> None:
        """The leader closes: nothing of its own runs on."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        for running in list(self._tasks):
            running.cancel()


OUTCOME = "failure outcome"
"""The task that turns another task's failure into the job's outcome; its own failure is only logged."""
