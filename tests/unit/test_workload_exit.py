"""A workload's exit is seen by the supervisor's event loop itself, the moment the process ends.

That is how a crash is detected (supervisor/workload_process.py). asyncio's child watcher on Python
3.11 is a thread per child, blocked in `waitpid`: it reaps the child at once, but the event loop
hears of it only once that thread takes the GIL back, which a busy event loop on a loaded machine
keeps retaking first. Here no thread but the event loop's may run at all, as such a thread: the exit
must still be seen, and the process reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

import pytest
from slicekeeper.supervisor.workload_process import STATUS_LOST, ExitStatus, WorkloadProcess

SLEEPS = [sys.executable, "-c", "import time; time.sleep(600)"]
EXITS_3 = [sys.executable, "-c", "raise SystemExit(3)"]

SEEN_WITHIN_SECONDS = 10.0
"""Generous: the exit is seen at the event loop's next turn after the process ended (milliseconds);
only an exit waiting on another thread, which never runs here, takes longer."""


@pytest.fixture
def threads_never_run(monkeypatch) -> list[threading.Thread]:
    """No thread started from now on ever runs (as a thread that never gets the GIL back): the
    threads asked to start, to check that none was."""
    started: list[threading.Thread] = []
    monkeypatch.setattr(threading.Thread, "start", lambda thread: started.append(thread))
    return started


def reaped(pid: int) -> bool:
    """Whether `pid` is no child of this process any more (not even a zombie waiting to be reaped)."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return False


async def killed(tmp_path: Path) -> tuple[ExitStatus, WorkloadProcess]:
    """A workload killed as it runs, and its exit as seen (TimeoutError: not seen)."""
    process = await WorkloadProcess.spawn(SLEEPS, {}, tmp_path / "workload.log")
    try:
        process.signal(signal.SIGKILL)
        return await asyncio.wait_for(process.wait(), SEEN_WITHIN_SECONDS), process
    finally:
        if process.running:  # its exit never seen (the negative control): killed and reaped here
            process.kill_group()
            with contextlib.suppress(ChildProcessError):
                os.waitpid(process.pid, 0)


def test_a_killed_workload_is_seen_dead_and_reaped_while_no_other_thread_runs(tmp_path, threads_never_run):
    status, process = asyncio.run(killed(tmp_path))
    assert status.describe() == "killed by SIGKILL"
    assert not process.running and process.returncode == -signal.SIGKILL
    assert reaped(process.pid)
    assert threads_never_run == []


def test_an_exit_code_is_seen_by_every_waiter_but_one_given_up_on(tmp_path, threads_never_run):
    async def scenario() -> tuple[ExitStatus, ExitStatus, bool]:
        process = await WorkloadProcess.spawn(EXITS_3, {}, tmp_path / "workload.log")
        given_up = asyncio.ensure_future(process.wait())  # as a standby's promotion wins over its exit
        waiting = asyncio.ensure_future(process.wait())
        await asyncio.sleep(0)
        given_up.cancel()
        status = await asyncio.wait_for(waiting, SEEN_WITHIN_SECONDS)
        return status, await process.wait(), given_up.cancelled()

    status, again, cancelled = asyncio.run(scenario())
    assert status == again == ExitStatus(3) and status.describe() == "exit code 3"
    assert cancelled
    assert threads_never_run == []


def test_a_reaped_workload_is_sent_no_signal(tmp_path):
    async def scenario() -> WorkloadProcess:
        process = await WorkloadProcess.spawn(EXITS_3, {}, tmp_path / "workload.log")
        await asyncio.wait_for(process.wait(), SEEN_WITHIN_SECONDS)
        process.signal(signal.SIGKILL)  # its pid may name another process by now: nothing is sent
        return process

    process = asyncio.run(scenario())
    assert not process.running and reaped(process.pid)


def test_a_workload_reaped_by_another_waiter_first_ends_with_its_status_lost(tmp_path):
    async def scenario() -> ExitStatus:
        process = await WorkloadProcess.spawn(EXITS_3, {}, tmp_path / "workload.log")
        os.waitpid(process.pid, 0)  # before the event loop's next turn: as a stale Popen polling its pid
        return await asyncio.wait_for(process.wait(), SEEN_WITHIN_SECONDS)

    status = asyncio.run(scenario())
    assert status == ExitStatus(STATUS_LOST)
    assert status.exit_code is None and status.signal_name is None and not status.succeeded


@pytest.mark.parametrize(
    ("returncode", "exit_code", "described"),
    [
        (0, 0, "exit code 0"),
        (3, 3, "exit code 3"),
        (-signal.SIGKILL, None, "killed by SIGKILL"),
        (STATUS_LOST, None, "exit status unknown (reaped by another waiter)"),
    ],
)
def test_an_exit_status_has_an_exit_code_only_when_the_process_exited(returncode, exit_code, described):
    status = ExitStatus(returncode)
    assert (status.exit_code, status.describe()) == (exit_code, described)
