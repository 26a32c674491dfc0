"""CPU stand-in: keep gloo's TCP event loop from taking the cores the hosts' work needs.

On CPU devices (the local TPU stand-in) JAX's cross-process collectives go over gloo, whose TCP
transport runs one event-loop thread per process (`gloo::transport::tcp::Loop`). Measured on the
2-core machine with the example job (4 host processes; `perf stat --per-thread -e
syscalls:sys_enter_epoll_wait`, `perf record`, /proc/PID/task/*/stat):

- that thread called `epoll_wait` about 475,000 times a second and spent 3.3-3.7 s of every 10 s in
  the kernel, in each trainer: 87 % of its samples in `epoll_wait` and only 11 % in the pairs' event
  handlers. A pair's handler returns at once when it cannot take the pair's lock (gloo's
  `Pair::handleEvents`, `try_to_lock`), and epoll, level-triggered, reports the same socket again
  at once: the loop spins for as long as the thread holding the lock is off the core, and on an
  oversubscribed machine that holder waits for the spinning threads' time slices;
- the four trainers together used 15.5 s of system and 2.3 s of user CPU per 10 s, 2.2 steps/s.

Putting only that thread in the idle scheduling class (`SCHED_IDLE`) lets every thread doing work run
first; the loop keeps only cycles nobody else wants, and runs at once when a core is free. Same run:
9.7 steps/s, 11.1 s system and 4.7 s user per 10 s (nice 19 instead: 6.6 steps/s). With two CPU hogs
beside the job it still went 3.7 steps/s against the untouched loop's 2.1.

The thread is found rather than named (gloo does not name it): a thread started after
`TransportThreads()` was made (before the framework created its CPU client) that is seen waiting in
`epoll_wait`. Linux only; on TPUs there is no gloo and the caller does not ask.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from pathlib import Path

_EPOLL_WAITS = {"x86_64": {232, 281, 441}, "aarch64": {22, 441}}
"""epoll_wait / epoll_pwait / epoll_pwait2 syscall numbers, by machine."""

SAMPLES = 40
"""How often each new thread's current syscall is looked at (a spinning loop is often on the CPU)."""


class TransportThreads:
    """Notes the threads that exist now; `quiet()` later puts the collective transport's event
    loops started since then in the idle scheduling class."""

    def __init__(self, tasks: Path = Path("/proc/self/task")) -> None:
        self._tasks = tasks
        self._before = self._threads()

    @staticmethod
    def supported() -> bool:
        return hasattr(os, "SCHED_IDLE") and platform.machine() in _EPOLL_WAITS

    def event_loops(self) -> list[int]:
        """Threads started since this object was made that wait in epoll_wait."""
        waits = _EPOLL_WAITS.get(platform.machine(), set())
        new = self._threads() - self._before
        found: set[int] = set()
        for _ in range(SAMPLES):
            for tid in new - found:
                if _current_syscall(self._tasks / str(tid)) in waits:
                    found.add(tid)
            if found:
                break
            time.sleep(0.001)
        return sorted(found)

    def quiet(self) -> list[int]:
        """Give the event loops only idle cycles; the thread ids changed (none where unsupported)."""
        if not self.supported():
            return []
        changed = []
        for tid in self.event_loops():
            with contextlib.suppress(OSError):  # a thread may end between finding and changing it
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                changed.append(tid)
        return changed

    def _threads(self) -> set[int]:
        try:
            return {int(name) for name in os.listdir(self._tasks)}
        except OSError:
            return set()


def _current_syscall(task: Path) -> int | None:
    """The syscall a thread is in (/proc/.../syscall), None when running or unreadable."""
    try:
        first = (task / "syscall").read_text().split(maxsplit=1)[0]
    except (OSError, IndexError):
        return None
    return int(first) if first.lstrip("-").isdigit() else None
