"""Scale benchmark of the operator: jobs of 64, 1,000 and 25,000 TPU hosts against the emulated API server.

Why it exists: the operator creates one pod per TPU host and watches every one of them. A job of
25,000 hosts (100k chips) must not cost the API server or the operator more per pod than a small
one, a single-host hot-swap must cost a handful of API writes whatever the job's size, and the
operator must render and submit such a job without holding it in memory. The unit and operator tests
use 4-host jobs, where none of that shows.

How: the emulated API server of the operator's tests (tests/support/cluster_emulator.py: kmock's
KubernetesEmulator plus what kopf needs) runs in this process; the operator runs in its own process,
as deployed (`slicekeeper operator --server URL --liveness URL`), so its memory is its own. It
serves every namespace: with `--namespace`, kopf lists `/api/v1/namespaces`, a path kmock cannot
parse (the operator stops on the 500). Per job size, a fresh emulator and operator:

1. the operator starts and opens its watches; a TrainingJob of `hosts` hosts is applied (one POST);
2. **time to all pods**: seconds from the apply until every pod of the job exists in the emulator;
   **requests per pod** and **writes per pod**: the operator's API requests (all of them: lists,
   watches, creates, patches, events), and its writes (creates, patches, deletes) alone, in that
   window, divided by the number of pods; the CPU both processes used meanwhile (which one is the
   bottleneck);
3. settle: the operator's reconciliation is done (its `Created` event and `status.slicesTotal`) and
   it has written nothing but the job's status for a few seconds; the scheduler's part is played by
   binding one pod to a node (a merge patch of `spec.nodeName`), then it settles again;
4. **hot-swap writes**: that pod is marked `Failed` with a merge patch of `status.phase`, as the
   kubelet would; the window ends when the replacement pod exists (same name, new uid), its
   `HotSwap` event is posted, the job's `status.restarts.replace` is 1 and the operator has written
   nothing but the job's status for a few seconds. Every write the operator made in that window is
   counted (our own patches are not: they carry our User-Agent), the periodic status patches that
   fell into it included;
5. **steady state**: `--idle` seconds of nothing happening: the operator's CPU share and its API
   requests, which is what the periodic status timer costs at that size;
6. **operator peak memory**: the operator process's VmHWM (peak resident set, from
   /proc/PID/status), once all pods exist (rendered and submitted), and after the hot-swap and the
   steady state (the whole run);
7. **cleanup** (unless `--no-delete`): the job is deleted; seconds until the operator's finalizer has
   deleted every pod and the job is gone, and the operator's peak memory after it;
8. **time to all pods at 50 ms** (unless `--no-delete`): the job is applied again with the emulator
   answering every request 50 ms late, as a busy or distant API server would: seconds until every pod
   exists (one create at a time, 25,000 pods would take 21 minutes: the operator's concurrency, not
   its CPU, is the limit here);
9. **restart** (unless `--restart-timeout 0`): with that job's pods there, the
   operator is stopped and a fresh one started: seconds until it serves the job again (its first
   status patch, written by the resume handler once it has read the job's pods: kopf runs no handler
   before its index of TrainingJobs is filled), and its peak memory. While it was down the job's
   last pod (the last that kopf's listing reaches) failed: seconds until it is replaced too. Given up
   after `--restart-timeout` seconds.

Job shapes: v5p hosts carry 4 chips; a size of N hosts runs N / h slices of h hosts (v5p-(8h)), h the
largest power of two up to 16 that divides N: 64 = 4 x 16 (v5p-128), 1,000 = 125 x 8 (v5p-64),
25,000 = 3,125 x 8 (v5p-64, 100k chips).

Targets: a single-host hot-swap costs at most 10 API writes, whatever the job size; a 25,000-host job
is rendered and submitted with the operator's peak memory under 1 GiB. Each size ends with one JSON
line of its headline figures: `hosts`, `pods_seconds`, `pods_seconds_at_50ms`, `cpu_ms_per_pod`,
`restart_serving_seconds`, `restart_replaced_seconds`, `peak_rss_mib`, `writes_per_hot_swap`,
`requests_per_pod`.

    .venv/bin/python -m benchmarks.operator_scale [--sizes 64,1000,25000] [--idle 30] [--json FILE]
        [--no-delete] [--restart-timeout 300] [--keep-logs DIR]

Run it as a module from the repo root (as above): it imports the emulator from the test suite
(`tests.support`), which the repo root on sys.path makes importable. Its parts are modules next to
this one: the job (operator_scale_job.py), the emulator and its request log
(operator_scale_emulator.py), the operator's process (operator_scale_process.py), the phases of one
size (operator_scale_run.py), the figures, table and targets (operator_scale_figures.py).

The emulator shares this process's event loop with the benchmark's own bookkeeping, which is kept
cheap (a running count of pods; the request log read only over a phase's window) so that the
benchmark never walks 25,000 objects while the operator waits for an answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import aiohttp

from benchmarks.operator_scale_emulator import USER_AGENT, BenchEmulator
from benchmarks.operator_scale_figures import Figures, summary, table, targets
from benchmarks.operator_scale_job import CHIPS_PER_HOST, shape_for
from benchmarks.operator_scale_process import OPERATOR_ARGS, mib, proc_status_kib, running_operator
from benchmarks.operator_scale_run import Run
from tests.support.emulator_server import serving

DEFAULT_SIZES = (64, 1000, 25000)
SLOW_ANSWER_SECONDS = 0.05
"""The emulated latency of the second creation (`pods_seconds_at_50ms`)."""


async def measure(hosts: int, idle: float, delete: bool, restart_timeout: float, logs: Path) -> Figures:
    shape = shape_for(hosts)
    print(
        f"\n== {shape.hosts} hosts: {shape.slices} x {shape.tpu_type} ({shape.hosts_per_slice} hosts each),"
        f" {shape.hosts * CHIPS_PER_HOST} chips",
        flush=True,
    )
    # A connection per request: a kept-alive one can stall behind a stopping operator's streams.
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        BenchEmulator() as emulator,
        serving(emulator),
        aiohttp.ClientSession(connector=connector, headers={"User-Agent": USER_AGENT}) as session,
    ):
        run = Run(emulator, session, shape, logs)
        f = run.figures
        log = logs / f"operator-{shape.hosts}.log"
        async with running_operator(run.url, log) as process:
            await run.operator_up(process, 0, log)
            await asyncio.sleep(1.0)
            f.operator_idle_mib = mib(proc_status_kib(process.pid, "VmHWM"))
            await run.create(process, log)
            await run.hot_swap()
            if idle > 0:
                await run.steady_state(process.pid, idle)
            f.operator_peak_mib = mib(proc_status_kib(process.pid, "VmHWM"))
            print(
                f"    operator peak memory: {f.operator_peak_mib_submitted:.0f} MiB once submitted,"
                f" {f.operator_peak_mib:.0f} MiB over the run (idle before the job:"
                f" {f.operator_idle_mib:.0f} MiB)",
                flush=True,
            )
            if delete:
                await run.delete(process, log)
                # The job again (the restart needs its pods), the emulator answering 50 ms late.
                emulator.latency = SLOW_ANSWER_SECONDS
                f.seconds_to_all_pods_at_50ms = await run.create(process, log, record=False)
                emulator.latency = 0.0
        if restart_timeout > 0:
            await run.restart(restart_timeout)
        f.emulator_rss_mib = mib(proc_status_kib(os.getpid(), "VmRSS"))
    print(json.dumps(summary(f)), flush=True)
    return f


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--sizes",
        default=",".join(map(str, DEFAULT_SIZES)),
        help="comma-separated job sizes in TPU hosts (default: %(default)s)",
    )
    parser.add_argument(
        "--idle",
        type=float,
        default=30.0,
        help="seconds of steady state measured after the hot-swap (default: %(default)s; 0: none)",
    )
    parser.add_argument("--no-delete", action="store_true", help="skip the deletion of the job")
    parser.add_argument(
        "--restart-timeout",
        type=float,
        default=300.0,
        help="restart the operator with the job's pods there, and wait this long for it to resume the job"
        " (default: %(default)s s; 0: no restart)",
    )
    parser.add_argument(
        "--operator-arg",
        action="append",
        default=[],
        help="an argument for the operator, e.g. --operator-arg=--api-qps=0 (repeatable)",
    )
    parser.add_argument("--json", type=Path, help="save the figures here")
    parser.add_argument("--keep-logs", type=Path, help="keep the operator's logs in this folder")
    args = parser.parse_args(argv)
    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    OPERATOR_ARGS[:] = args.operator_arg
    results: list[Figures] = []
    with tempfile.TemporaryDirectory(prefix="operator-scale-") as tmp:
        workdir = args.keep_logs or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for hosts in sizes:
            results.append(
                asyncio.run(measure(hosts, args.idle, not args.no_delete, args.restart_timeout, workdir))
            )
    print()
    print(table(results))
    print()
    for line in targets(results):
        print(line)
    if args.json is not None:
        document = {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "results": [asdict(f) for f in results],
            "targets": targets(results),
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
