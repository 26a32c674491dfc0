"""Starting, signalling and classifying the workload process.

The workload runs in its own process group (so a kill reaches every process it started) and dies
with its supervisor (PR_SET_PDEATHSIG): a lost supervisor never leaves an orphan training process.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
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


@dataclass(frozen=True)
class ExitStatus:
    returncode: int

    @property
    def signal_name(self) -> str | None:
        if self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None

    @property
    def succeeded(self) -> bool:
        return self.returncode == 0

    def describe(self) -> str:
        name = self.signal_name
        return f"killed by {name}" if name else f"exit code {self.returncode}"


class WorkloadProcess:
    def __init__(self, process: asyncio.subprocess.Process, log_path: Path) -> None:
        self._process = process
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process.returncode is None

    @classmethod
    async def spawn(
        cls,
        argv: list[str],
        env: dict[str, str],
        log_path: Path,
        cwd: str | None = None,
        before_exec: Callable[[], None] | None = None,
    ) -> WorkloadProcess:
        """`before_exec`: run in the child too, after `die_with_parent` (e.g. its confinement)."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        preexec = die_with_parent if before_exec is None else _both(die_with_parent, before_exec)
        with log_path.open("ab") as log:
            process = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                cwd=cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
            )
        return cls(process, log_path)

    async def wait(self) -> ExitStatus:
        return ExitStatus(await self._process.wait())

    def signal(self, signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._process.pid, signum)

    def kill_group(self) -> None:
        """SIGKILL the workload and everything in its process group (its idle-class threads woken
        first: see `wake_idle_threads`)."""
        wake_idle_threads(self._process.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)
        self.signal(signal.SIGKILL)

    async def stop(self) -> ExitStatus:
        self.kill_group()
        return await self.wait()
