"""Quiet logs at scale: what the operator does for each pod at DEBUG, a summary line per job.

kopf says "Handler '...node_event' succeeded." at INFO for every event of every node it hands the
operator, and "Timer '...keep' succeeded." for every job every few seconds (and it said the same of
every pod event while kopf watched the pods: creating and deleting a 5,000-host job logged 15,004
such lines, benchmarks/operator_scale.py), which buries the lines that matter (a failure, a
hot-swap, a job's phase) and costs the operator CPU. The operator's own pod informers (operator/
pod_informers.py) log nothing per pod. `RoutineAtDebug` turns those lines into DEBUG
(shown with `--log-level debug`, dropped otherwise); whatever else kopf says (a failure, a retry, a
change handler of a job) keeps its level. In their place, `JobActivity` counts what the operator did
for each job (pod events handled, pods created, pods replaced, notices given, pods deleted) and the
job's timer says it in one line, at most once per `SUMMARY_SECONDS` and only when something happened:
an idle operator logs nothing.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable

from slicekeeper.operator.pod_store import JobKey

KOPF_OBJECTS_LOGGER = "kopf.objects"
"""The logger kopf says each handler's outcome on (with the object it handled)."""
ROUTINE_HANDLERS = ("node_event", "keep")
"""The handlers run per node or per job interval: their success is routine."""
_ROUTINE = re.compile(
    r"^(?:Handler|Timer) '(?:[^']*\.)?(?:" + "|".join(ROUTINE_HANDLERS) + r")' succeeded\.$"
)
SUMMARY_SECONDS = 60.0
"""At most one summary line per job this often."""


class RoutineAtDebug(logging.Filter):
    """kopf's "succeeded" lines of the routine handlers turned into DEBUG records: passed on when
    `shown` (the operator logs at DEBUG), dropped otherwise."""

    def __init__(self, *, shown: bool) -> None:
        super().__init__()
        self.shown = shown

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO and _ROUTINE.match(record.getMessage()):
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
            return self.shown
        return True


def quiet_routine(level: int) -> RoutineAtDebug:
    """Install the filter on kopf's handler log, for an operator logging at `level`."""
    routine = RoutineAtDebug(shown=level <= logging.DEBUG)
    logging.getLogger(KOPF_OBJECTS_LOGGER).addFilter(routine)
    return routine


class JobActivity:
    """What the operator did for each job since its last summary line. `note` is called from kopf's
    event loop and from its handler threads alike, hence the lock."""

    def __init__(
        self, interval: float = SUMMARY_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[JobKey, Counter[str]] = {}
        self._said: dict[JobKey, float] = {}

    def note(self, job: JobKey, what: str, count: int = 1) -> None:
        """`count` more of `what` ("pod events", "pods created", ...) done for `job`."""
        if count <= 0:
            return
        with self._lock:
            self._counts.setdefault(job, Counter())[what] += count

    def summary(self, job: JobKey) -> str | None:
        """The line to say for `job` now: what was done since the last one, when anything was and the
        last one is `interval` old (the first is said at once); else None."""
        now = self._clock()
        with self._lock:
            counts = self._counts.get(job)
            if not counts or now - self._said.get(job, -self.interval) < self.interval:
                return None
            del self._counts[job]
            since = self._said.get(job)
            self._said[job] = now
        done = ", ".join(f"{count} {what}" for what, count in sorted(counts.items()))
        period = "" if since is None else f" in the last {now - since:.0f} s"
        return f"job {job[0]}/{job[1]}: {done}{period}"

    def forget(self, job: JobKey) -> str | None:
        """The job is gone: what was done for it since the last line (said whatever the interval)."""
        with self._lock:
            counts = self._counts.pop(job, None)
            self._said.pop(job, None)
        if not counts:
            return None
        done = ", ".join(f"{count} {what}" for what, count in sorted(counts.items()))
        return f"job {job[0]}/{job[1]}: {done} before it was deleted"
