"""The two ways a host notices that its workload stopped training: it exited, or it fell silent.

An exit is classified (finished after the SDK's `done`, or a crash, with its exit code or signal)
once the workload's last SDK lines are read. Silence is judged by the hang detector
(supervisor/signals/hang.py), whose allowance follows what the workload is doing; a hang is reported once
per silence, and the leader then names the host that stopped (supervisor/signals/culprit.py), or, when no
host stands out, looks again before it restarts the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.metrics import SupervisorMetrics
from slicekeeper.supervisor.reporting import Report
from slicekeeper.supervisor.signals.hang import HangDetector
from slicekeeper.supervisor.workload_process import ExitStatus, WorkloadProcess

from slicekeeper.goodput import Category, GoodputAccountant
from slicekeeper.policy.events import FaultKind

SDK_DRAIN_SECONDS = 1.0
"""After an exit, how long to wait for the workload's remaining SDK lines (EOF comes at once)."""

WATCH_INTERVAL = 0.05
"""Seconds between hang checks; bounds the detection latency added on top of the timeout."""


def finished_message(generation: int, done: dict[str, Any]) -> messages.Finished:
    """A clean exit after the SDK's `done` (its fields checked by host.sdk_events): the generation
    finished training."""
    return messages.Finished(generation=generation, step=done["step"], fingerprint=done.get("fingerprint"))


def crash_message(status: ExitStatus, generation: int, workload: WorkloadProcess) -> messages.Fault:
    """Any other exit, a clean one before `done` included: a crash."""
    detail = status.describe() if not status.succeeded else "exit code 0 before training finished"
    return messages.Fault(
        generation=generation,
        kind=FaultKind.CRASH,
        exit_code=status.exit_code,
        signal=status.signal_name,
        detail=f"workload {detail} (log: {workload.log_path})",
    )


class ExitWatch:
    """Waits for a generation's workload to exit and tells the leader what the exit means."""

    def __init__(
        self,
        *,
        report: Report,
        accountant: GoodputAccountant,
        drain: Callable[[], Awaitable[None]],
        sdk_read: Callable[[int], asyncio.Event],
        done: Callable[[], dict[str, Any] | None],
        current: Callable[[int], bool],
    ) -> None:
        """`drain`: until the final checkpoint reached the peer and persistent tiers; `sdk_read`: set
        once a generation's SDK connection is read to the end; `done`: the SDK's `done` event of the
        current generation; `current`: whether a generation is still the one running (not stopped,
        the supervisor not ending)."""
        self._report = report
        self._accountant = accountant
        self._drain = drain
        self._sdk_read = sdk_read
        self._done = done
        self._current = current

    async def watch(self, workload: WorkloadProcess, generation: int) -> None:
        status = await workload.wait()
        # The exit can be noticed before the last SDK lines (`done`) are read: drain them first.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._sdk_read(generation).wait(), SDK_DRAIN_SECONDS)
        if not self._current(generation):
            return
        done = self._done()
        if status.succeeded and done is not None:
            self._accountant.switch(Category.CHECKPOINT_SAVE, time.time())
            await self._drain()
            self._accountant.switch(Category.OTHER, time.time())
            await self._report(finished_message(generation, done))
            return
        await self._report(crash_message(status, generation, workload))


class HangWatch:
    """Checks the hang detector every WATCH_INTERVAL and reports a hang once per silence: again only
    once the workload spoke after the report (the leader found the job only slow, and it went on)."""

    def __init__(
        self,
        detector: HangDetector,
        metrics: SupervisorMetrics,
        *,
        report: Report,
        watched: Callable[[], int | None],
    ) -> None:
        """`watched`: the generation whose workload is running and not being stopped, else None."""
        self._detector = detector
        self._metrics = metrics
        self._report = report
        self._watched = watched
        self._reported: float | None = None
        """The start of the silence reported last (the workload's last event then), if any."""

    def rearm(self) -> None:
        """A new generation starts: its hang is yet to be reported."""
        self._reported = None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            now = time.time()
            allowance = self._detector.allowance()
            self._metrics.hang_timeout.set(allowance.seconds)
            generation = self._watched()
            if self._reported is not None and self._detector.last_activity > self._reported:
                self._reported = None  # that silence ended: a new one is a new hang
            if generation is None or self._reported is not None:
                continue
            silent = self._detector.silent_for(now)
            if silent > allowance.seconds:
                self._reported = self._detector.last_activity
                await self._report(
                    messages.Fault(
                        generation=generation,
                        kind=FaultKind.HANG,
                        silent_seconds=round(silent, 3),
                        detail=f"no progress for {silent:.1f} s (limit {allowance.seconds:.1f} s, "
                        f"{allowance.basis})",
                    )
                )
