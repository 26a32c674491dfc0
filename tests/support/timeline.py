"""Where the suite's time and CPU go, test by test: a JSON line per test when asked for.

`make test` is bound by the machine's two cores (docs/testing.md), so what a cut saves is CPU, and
wall times alone mislead: a test that sleeps costs the others nothing. With
`SLICEKEEPER_TEST_TIMELINE=<file>` set, every test (its fixtures included, inside its turn: the wait
for a heavy slot or for the machine to empty is not counted) appends to `<file>`:

    {"worker": "gw0", "test": "<node id>", "start": ..., "stop": ..., "cpu": ...}

`cpu` is the CPU seconds of the pytest worker and of every process it started and reaped meanwhile
(`getrusage` of itself and of its children: a `slicekeeper run`'s supervisors and workloads count
once their run has ended). `python -m tests.support.timeline <file>` prints the totals by file and
when each worker ended, as docs/testing.md quotes them.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path

VARIABLE = "SLICEKEEPER_TEST_TIMELINE"


def cpu_seconds() -> float:
    """CPU seconds of this process and of its reaped descendants, user and system."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@contextlib.contextmanager
def record(test: str, destination: str | None = None) -> Iterator[None]:
    """Append the block's wall clock and CPU to `destination` (default: $SLICEKEEPER_TEST_TIMELINE;
    unset: nothing is measured)."""
    destination = destination if destination is not None else os.environ.get(VARIABLE)
    if not destination:
        yield
        return
    start, cpu = time.time(), cpu_seconds()
    try:
        yield
    finally:
        line = {
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "test": test,
            "start": start,
            "stop": time.time(),
            "cpu": round(cpu_seconds() - cpu, 3),
        }
        with open(destination, "a") as out:  # one short write a line: the workers' lines do not mix
            out.write(json.dumps(line) + "\n")


def summary(path: Path, top: int = 30) -> str:
    """The timeline's totals: the tests' CPU and time, the files by CPU, when each worker ended."""
    lines = [json.loads(text) for text in path.read_text().splitlines() if text.strip()]
    if not lines:
        return f"{path}: no test recorded"
    first = min(line["start"] for line in lines)
    by_file: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    ends: dict[str, float] = {}
    for line in lines:
        totals = by_file[line["test"].split("::")[0]]
        totals[0] += line["cpu"]
        totals[1] += line["stop"] - line["start"]
        totals[2] += 1
        ends[line["worker"]] = max(ends.get(line["worker"], 0.0), line["stop"] - first)
    cpu = sum(totals[0] for totals in by_file.values())
    spent = sum(totals[1] for totals in by_file.values())
    report = [
        f"{len(lines)} tests: {cpu:,.0f} s of CPU, {spent:,.0f} s of the workers' time",
        "workers ended at " + ", ".join(f"{worker} {end:,.0f} s" for worker, end in sorted(ends.items())),
        f"{'CPU s':>8} {'time s':>8} {'tests':>5}  file",
    ]
    for file, (file_cpu, file_time, count) in sorted(by_file.items(), key=lambda item: -item[1][0])[:top]:
        report.append(f"{file_cpu:8.1f} {file_time:8.1f} {count:5d}  {file}")
    return "\n".join(report)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.support.timeline <timeline file>")
    print(summary(Path(sys.argv[1])))
