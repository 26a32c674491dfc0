"""The throttle slows a real process group down by duty cycling it, and never leaves it stopped.

The children are busy loops, each in its own session (a process group, like the supervisor's
workload). Work done is CPU time consumed. This machine is noisy and shared, so a throttled child is
compared with an unthrottled twin over the same stretch of time (both see the same load), and the
bounds are generous.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from slicekeeper.supervisor.throttle import Throttle

WAIT = 30.0
WINDOW = 2.0
"""Seconds over which the twins' work is compared."""

BUSY_CHILD = """
print("ready", flush=True)
total = 0
while True:
    total += 1
"""


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 4 * WAIT))


@contextlib.asynccontextmanager
async def busy_child() -> AsyncIterator[asyncio.subprocess.Process]:
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", BUSY_CHILD, stdout=asyncio.subprocess.PIPE, start_new_session=True
    )
    assert child.stdout is not None
    try:
        assert (await asyncio.wait_for(child.stdout.readline(), WAIT)).strip() == b"ready"
        yield child
    finally:
        if child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            await child.wait()


def stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name: [state, ppid, ...]."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def state(pid: int) -> str:
    """The process state letter (T: stopped)."""
    return stat_fields(pid)[0]


def cpu_seconds(pid: int) -> float:
    """CPU time the process has used (user + system)."""
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def work_done(*pids: int, seconds: float = WINDOW) -> list[float]:
    """CPU seconds each process used during the same `seconds` of wall time."""
    before = [cpu_seconds(pid) for pid in pids]
    await asyncio.sleep(seconds)
    return [cpu_seconds(pid) - used for pid, used in zip(pids, before, strict=True)]


async def until_state(pid: int, wanted: str) -> None:
    async with asyncio.timeout(WAIT):
        while state(pid) != wanted:
            await asyncio.sleep(0.001)


async def works_on(pid: int) -> None:
    """Return once the process has used more CPU time (it is neither stopped nor starved for good)."""
    used = cpu_seconds(pid)
    async with asyncio.timeout(WAIT):
        while cpu_seconds(pid) <= used:
            await asyncio.sleep(0.01)


def test_a_factor_of_two_keeps_the_group_stopped_about_half_of_the_time():
    async def scenario() -> None:
        async with busy_child() as child:
            throttle = Throttle(child.pid, factor=2.0)
            throttle.start()
            samples: list[str] = []
            for _ in range(1000):
                samples.append(state(child.pid))
                await asyncio.sleep(0.002)
            await throttle.stop()
        assert 0.3 < samples.count("T") / len(samples) < 0.7

    run(scenario)


def test_a_factor_of_two_does_clearly_less_work_than_a_twin_and_stopping_restores_the_pace():
    async def scenario() -> None:
        async with busy_child() as slowed, busy_child() as twin:
            # Long stops: the kernel repays a few milliseconds of missed CPU per stop to a task that
            # competes with others, and this machine is often loaded (the throttle's docstring).
            throttle = Throttle(slowed.pid, factor=2.0, period=0.2)
            throttle.start()
            assert throttle.running
            throttled, twin_meanwhile = await work_done(slowed.pid, twin.pid)
            await throttle.stop()
            assert not throttle.running
            assert state(slowed.pid) != "T"
            after, twin_after = await work_done(slowed.pid, twin.pid)
        assert twin_meanwhile > 1.4 * throttled
        assert after > 0.7 * twin_after  # at the twin's pace again

    run(scenario)


def test_stopping_while_the_group_is_stopped_continues_it():
    async def scenario() -> None:
        async with busy_child() as child:
            throttle = Throttle(child.pid, factor=1000.0, period=1.0)  # almost always stopped
            throttle.start()
            await until_state(child.pid, "T")
            await throttle.stop()
            assert state(child.pid) != "T"
            await works_on(child.pid)

    run(scenario)


def test_stopping_without_resume_leaves_the_group_stopped_for_a_hang():
    async def scenario() -> None:
        async with busy_child() as child:
            throttle = Throttle(child.pid, factor=1000.0, period=1.0)
            throttle.start()
            await until_state(child.pid, "T")
            await throttle.stop(resume=False)
            await asyncio.sleep(1.5)  # past the end of the period: no continue comes
            assert state(child.pid) == "T"
            assert not throttle.running
            os.killpg(child.pid, signal.SIGCONT)

    run(scenario)


def test_a_group_that_is_gone_ends_the_throttle_and_stopping_it_does_not_raise():
    async def scenario() -> None:
        async with busy_child() as child:
            throttle = Throttle(child.pid, factor=2.0, period=0.01)
            throttle.start()
            os.killpg(child.pid, signal.SIGKILL)
            await child.wait()  # reaped: the group no longer exists
            async with asyncio.timeout(WAIT):
                while throttle.running:
                    await asyncio.sleep(0.01)
            await throttle.stop()
            await throttle.stop(resume=False)

    run(scenario)


def test_stopping_a_throttle_that_never_started_only_continues_the_group():
    async def scenario() -> None:
        async with busy_child() as child:
            os.killpg(child.pid, signal.SIGSTOP)
            await until_state(child.pid, "T")
            await Throttle(child.pid, factor=2.0).stop()
            assert state(child.pid) != "T"

    run(scenario)


@pytest.mark.parametrize(("factor", "period"), [(1.0, 0.05), (0.5, 0.05), (float("inf"), 0.05), (2.0, 0.0)])
def test_a_throttle_that_would_not_slow_down_is_refused(factor, period):
    with pytest.raises(ValueError):
        Throttle(1, factor=factor, period=period)
