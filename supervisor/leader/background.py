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
from collections.abc import Callable, Coroutine
from enum import StrEnum
from typing import Any

from slicekeeper.supervisor.leader.restart_inbox import RestartInbox

Work = Coroutine[Any, Any, None]


class Task(StrEnum):
    """What the leader runs in the background: the metric's fixed label set, each counted from 0.
    Each task carries its own words (`description`), for the log and the job's failure reason: a
    task cannot be added without them."""

    description: str

    def __new__(cls, value: str, description: str) -> Task:
        task = str.__new__(cls, value)
        task._value_ = value
        task.description = description
        return task

    DECISION = "decision", "a decision"
    """A decision on an event and its steps (leader.remediation), where it runs or is awaited."""
    NOTICE = "notice", "acting on a notice of an announced loss"
    """Saving on a notice of an announced loss, then deciding on it (leader.announced)."""
    HANG_CULPRIT = "hang_culprit", "naming a hang's culprit"
    """Naming a hang's culprit from the members' answers (supervisor.signals.culprit)."""
    WAIT = "wait", "reconsidering after a Wait"
    """Reconsidering an event once a policy's `Wait` is over."""
    STOP_ACKS = "stop_acks", "taking in the members' stop acknowledgements"
    """Taking in the members' stop acknowledgements, a batch at a time (leader.generations)."""
    ACK_DEADLINE = "ack_deadline", "the stop acknowledgement deadline"
    """The deadline for every member to acknowledge a stop."""
    REPLACEMENT = "replacement", "awaiting a replacement pod"
    """The time a lost host's replacement pod is awaited."""
    TAKEOVER = "takeover", "taking over from a lost leader"
    """Taking over from a lost leader (leader.takeover)."""
    STAND_DOWN = "stand_down", "standing down"
    """Saying that this leader stands down."""
    RESTART = "restart", "carrying out the restart state machine's commands"
    """Taking the restart state machine's queued events on, when their taker was cancelled; and
    what fails while a command is carried out (leader.generations)."""
    OUTCOME = "outcome", "failing the job"
    """Turning another task's failure into the job's outcome; its own failure is only logged."""


class BackgroundWork:
    def __init__(self, *, leading: Callable[[], bool], inbox: RestartInbox) -> None:
        """`leading`: whether this leader still surely holds the job's lease; `inbox`: the restart
        machine's, where a failure becomes the job's (leader.restart_inbox)."""
        self.leading = leading
        self.inbox = inbox
        self._stood_down = False
        """The leader stands down (`stand_down`): a failure is no longer the job's (its successor
        carries on)."""
        self.failures: Counter[Task] = Counter({task: 0 for task in Task})
        """Failed background work, by task (every task from 0)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._timers: set[asyncio.TimerHandle] = set()

    def spawn(self, task: Task, work: Work, what: str | None = None) -> asyncio.Task[None]:
        """Run `work` (`task`: which, for the metric; `what`: it in words, for the log and the job's
        failure reason, by default the task's own description)."""
        running = asyncio.ensure_future(work)
        self._tasks.add(running)
        running.add_done_callback(lambda done: self._ended(task, what, done))
        return running

    def later(self, seconds: float, task: Task, work: Callable[[], Work]) -> asyncio.TimerHandle:
        """Run `work()` in `seconds`, if this leader still leads then; cancel with the handle."""

        def fire() -> None:
            self._timers.discard(handle)
            if self.leading():
                self.spawn(task, work())

        handle = asyncio.get_running_loop().call_later(seconds, fire)
        self._timers.add(handle)
        return handle

    def _ended(self, task: Task, what: str | None, done: asyncio.Task[None]) -> None:
        self._tasks.discard(done)
        if done.cancelled():
            return
        error = done.exception()
        if error is None:
            return
        if task is Task.OUTCOME:
            self._count_and_log(task, what, error)  # the outcome itself failed: nothing further to do
        else:
            self.spawn(Task.OUTCOME, self.failed(task, error, what))

    async def failed(self, task: Task, error: BaseException, what: str | None = None) -> None:
        """`task` raised `error` (in the background or where it was awaited): log it, count it, and
        fail the job with the reason rather than have it wait for ever; unless this leader no longer
        leads or stands down (its successor carries on)."""
        said = self._count_and_log(task, what, error)
        if self._stood_down or not self.leading():
            return
        await self.inbox.fail(f"the leader's background work failed ({said}): {error!r}")

    def stand_down(self) -> None:
        """The leader acts no more: what fails from now on is not the job's failure."""
        self._stood_down = True

    def _count_and_log(self, task: Task, what: str | None, error: BaseException) -> str:
        self.failures[task] += 1
        said = what or task.description
        trace = "".join(traceback.format_exception(error))
        print(f"leader: {said} failed:\n{trace}", file=sys.stderr, flush=True)
        return said

    def cancel(self) -> None:
        """The leader closes: nothing of its own runs on."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        for running in list(self._tasks):
            running.cancel()
