"""The operator's process in the operator scale benchmark (benchmarks/operator_scale.py): started as
deployed (`slicekeeper operator --server URL`), its memory and CPU read from /proc, and waiting on a
condition with progress lines.

Its own module: the operator runs in a process of its own so that its memory is its own; what reads
that process is independent of the job and of the emulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from resource import RUSAGE_SELF
from resource import getrusage as resource_usage
from typing import Any

from slicekeeper.supervisor.ports import free_port

PROGRESS_SECONDS = 10.0


def proc_status_kib(pid: int, key: str) -> int:
    """A `kB` field of /proc/PID/status (VmHWM: peak resident set; VmRSS: now)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise KeyError(key)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource_usage(RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def mib(kib: int) -> float:
    return kib / 1024


OPERATOR_ARGS: list[str] = []
"""More arguments for every operator the benchmark starts (`--operator-arg`)."""


@contextlib.asynccontextmanager
async def running_operator(url: str, log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    port = free_port()
    with log.open("w") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "slicekeeper.cli", "operator", "--server", url,
            "--liveness", f"http://127.0.0.1:{port}/healthz", "--metrics-port", "0", *OPERATOR_ARGS,
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            yield process
        finally:
            if process.returncode is None:
                process.terminate()
                try:
                    await asyncio.wait_for(process.wait(), 30)
                except TimeoutError:
                    process.kill()
                    await process.wait()


async def wait_for(
    check: Callable[[], Any], timeout: float, what: str, progress: Callable[[], str] | None = None
) -> Any:
    """Wait until `check()` is truthy (returning it), printing `progress()` every so often."""
    started = last = time.monotonic()
    while True:
        result = check()
        if result:
            return result
        now = time.monotonic()
        if now - started > timeout:
            raise TimeoutError(f"not within {timeout:.0f} s: {what}")
        if progress is not None and now - last >= PROGRESS_SECONDS:
            last = now
            print(f"    {now - started:6.0f} s  {progress()}", flush=True)
        await asyncio.sleep(0.1)
