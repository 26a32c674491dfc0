"""Starting, signalling and classifying the workload process.

The workload runs in its own process group (so a kill reaches every process it started) and dies
with its supervisor (PR_SET_PDEATHSIG): a lost supervisor never leaves an orphan training process.

Its exit is seen by the supervisor's event loop itself, through a pidfd, as the process ends: that is
how a crash is detected. Not through asyncio's child watcher, which on Python 3.11 is a thread per
child blocked in `waitpid`: that thread reaps the child at once, but must take the GIL back to tell
the event loop, and on a loaded machine an event loop busy with short system calls retakes the GIL
first, again and again (docs/supervisor.md, "Exit classification").
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when its parent exits (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _both(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        first()
        second()

    return run


def wake_idle_threads(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """Put process `pid`'s threads of the idle scheduling class back in the normal one; the thread
    ids changed. The reference trainers put gloo's event loop there on CPU devices
    (workload/collective_transport.py), and a killed process ends only once each of its threads has
    run: on a busy machine an idle-class thread waits for an idle core, which made a stopped
    workload's exit 0.3-0.5 s late here. Best effort: without CAP_SYS_NICE the kernel refuses
    (EPERM) and the kill waits."""
    if not hasattr(os, "SCHED_IDLE"):
        return []
    try:
        threads = [int(name) for name in os.listdir(proc / str(pid) / "task")]
    except (OSError, ValueError):
        return []
    woken = []
    for tid in threads:
        with contextlib.suppress(OSError):
            if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                woken.append(tid)
    return woken


STATUS_LOST = 256
"""A workload's code when another waiter in this process reaped it first (not an exit code: those
are 0-255, or minus a signal): a stale `subprocess.Popen` polls its own pid whenever a Popen is made,
and the kernel may have given that pid to the workload."""


@dataclass(frozen=True)
class ExitStatus:
    returncode: int
    """The exit code, minus the signal that killed it, or STATUS_LOST."""

    @property
    def signal_name(self) -> str | None:
        if self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None

    @property
    def exit_code(self) -> int | None:
        """The code it exited with; None when a signal killed it or its status was lost."""
        return self.returncode if 0 <= self.returncode < STATUS_LOST else None

    @property
    def succeeded(self) -> bool:
        return self.returncode == 0

    def describe(self) -> str:
        if self.returncode == STATUS_LOST:
            return "exit status unknown (reaped by another waiter)"
        name = self.signal_name
        return f"killed by {name}" if name else f"exit code {self.returncode}"


class WorkloadProcess:
    """One workload process, owned through a pidfd: the event loop sees it exit and reaps it, and
    signals it only while it is not reaped (its pid is still its own then). The Popen that starts
    it is never asked about it, and is told its code once it is read, so that nothing in subprocess
    polls that pid later either."""

    def __init__(self, popen: subprocess.Popen[bytes], log_path: Path) -> None:
        self._popen = popen
        self.log_path = log_path
        self.returncode: int | None = None
        """Its exit code (minus the signal that killed it), or STATUS_LOST; None while not reaped."""
        self._loop = asyncio.get_running_loop()
        self._ended: asyncio.Future[int] = self._loop.create_future()
        self._pidfd = os.pidfd_open(popen.pid)
        self._loop.add_reader(self._pidfd, self._exited)

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def running(self) -> bool:
        return self.returncode is None

    @classmethod
    async def spawn(
        cls,
        argv: list[str],
        env: dict[str, str],
        log_path: Path,
        cwd: str | None = None,
        before_exec: Callable[[], None] | None = None,
    ) -> WorkloadProcess:
        """`before_exec`: run in the child too, after `die_with_parent` (e.g. its confinement).
        OSError: it could not be started."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        preexec = die_with_parent if before_exec is None else _both(die_with_parent, before_exec)
        with log_path.open("ab") as log:
            popen = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
            )
        return cls(popen, log_path)

    async def wait(self) -> ExitStatus:
        # Shielded: a waiter given up on (a standby promoted first) must not cancel the end others await.
        return ExitStatus(await asyncio.shield(self._ended))

    def signal(self, signum: signal.Signals) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signum)

    def kill_group(self) -> None:
        """SIGKILL the workload and everything in its process group (its idle-class threads woken
        first: see `wake_idle_threads`)."""
        if self.returncode is None:
            wake_idle_threads(self.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self.signal(signal.SIGKILL)

    async def stop(self) -> ExitStatus:
        self.kill_group()
        return await self.wait()

    def _exited(self) -> None:
        """Its pidfd is readable: it exited; reaped here, on the event loop."""
        try:
            status = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG)
            if status is None:
                return  # not a zombie yet
            code = status.si_status if status.si_code == os.CLD_EXITED else -status.si_status
        except ChildProcessError:
            code = STATUS_LOST
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self.returncode = self._popen.returncode = code
        self._ended.set_result(code)
