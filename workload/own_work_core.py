"""Local mode: run each host's own work on one core, so that its timing measures the host.

On a real slice every host has its own chips, and the time of its own work (`StepRecord.work_done`)
is the host's. In local mode 4 host processes share the machine's few cores and each process's XLA
thread pool asks for all of them. After each step's collective every host starts its own work at
once, and the timing then measured the contention rather than the host. On this 2-core machine,
over a 200-step healthy run of the example job:

| own work timed as            | per-step spread (log sigma) | straggler score: spread, max |
|------------------------------|-----------------------------|------------------------------|
| wall time, any core          | 0.55 to 0.62                | 0.12, 1.54 (1.6 over 5 min)  |
| CPU time, any core           | 0.53 to 0.61                | 0.18 to 0.23, 2.14           |
| CPU time, one core per host  | 0.12 to 0.17                | 0.03, 1.09                   |

Wall time counts the other hosts' turns on the cores; CPU time on any core counts the XLA pool's
threads spinning while they wait for each other. With one core for the whole process during its own
work, neither happens. The reference trainer times own work on CPU devices in CPU seconds
(`WorkClock.CPU`), and the supervisor gives each local host one core (`protocol.ENV_OWN_WORK_CORE`,
host mod cores), to which the SDK confines every thread of the process from the step's begin to
`work_done()`. The collective and the update run on every core again. The price: steps about 25%
slower here (358 to 462 ms), as a host's own work can no longer borrow the other core.

Linux only (`os.sched_setaffinity`); elsewhere, and on a real slice (no variable), nothing changes.
"""

from __future__ import annotations

import contextlib
import os


class OwnWorkCore:
    """Confines this process's threads to one core during own work, and releases them after."""

    def __init__(self, core: int) -> None:
        self.core = core
        self._everywhere: set[int] | None = None
        self._confined = False

    @staticmethod
    def supported() -> bool:
        return hasattr(os, "sched_setaffinity") and os.path.isdir("/proc/self/task")

    def confine(self) -> None:
        if self._confined or not self.supported():
            return
        if self._everywhere is None:
            self._everywhere = set(os.sched_getaffinity(0))
        if self.core not in self._everywhere:
            return  # the core is not ours to use (a narrower cgroup): leave the threads alone
        _set_threads({self.core})
        self._confined = True

    def release(self) -> None:
        if not self._confined or self._everywhere is None:
            return
        _set_threads(self._everywhere)
        self._confined = False


def _set_threads(cores: set[int]) -> None:
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread may end between the listing and the call
            os.sched_setaffinity(int(task), cores)
