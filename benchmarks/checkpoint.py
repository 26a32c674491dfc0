"""Benchmark of the checkpoint tiers: save stall, cost of the peer and persistent tiers, restore by source.

Why: the local tier is on the training process's critical path (the blocking part of a save), the
peer and persistent tiers are not (the supervisor copies committed steps in the background), and a
restart or a hot-swap stages each host's shard back from the closest valid copy. This script puts
numbers on each of those claims for the reference JAX job, so a change to a tier shows up as a figure.

It runs the example job (`examples/trainingjob.yaml`: 4 host processes x 2 CPU devices) with its
`spec.checkpoint` overridden in a temp YAML (a local save every 10 steps) in six scenarios, each a
subprocess `slicekeeper run JOB --steps N --spares 0|1 [--chaos ...] --report PATH`:

- `local`: peer replicas 0, no persistent tier, no fault;
- `local+peer`: 1 peer replica, no fault;
- `local+peer+persistent`: 1 peer replica, persistent every 20 steps (a temp dir), no fault;
- `kill (local restore)`: 1 peer replica, `kill:host=2@step=S` (every host restores from its local tier);
- `lose (peer restore)`: 1 peer replica, `--spares 1`, `lose:host=1@step=S` (hot-swap; host 1's
  shard comes from its peer replica);
- `lose (persistent restore)`: peer replicas 0, persistent every 10 steps, `--spares 1`,
  `lose:host=1@step=S` (hot-swap; host 1's shard comes from the persistent tier).

Figures, from the reports and the machines' `events.jsonl` (`host-N/`, `spare-N/` under the run dir):

1. save stall: each workload `checkpoint_save` phase event to the next phase event (the blocking
   device-to-host copy; the write runs in the background), per save; and per host, the time in saves
   divided by the time in steps (step_begin -> step_end, the first step of each start left out since
   it compiles), mean over hosts, for each of the three fault-free scenarios. Target: <= 2 %.
   Cost of the background tiers: the median step time of each fault-free scenario and its difference
   to `local`; the median of the 3 steps after each save (they carry the save's background work:
   the local write, then the peer push, then the upload), comparable across the three scenarios;
   and the median of the steps that overlap a peer push or a persistent upload (any machine's
   `replicated` / `persisted` record, [t - seconds, t]).
2. peer replication (`replicated` records: seconds and MB per push of one host's shard to one holder)
   and persistent upload (`persisted` records: seconds and MB per host shard).
3. restore by source: the supervisors' staging seconds from the report's `restores` (median over the
   shards staged from the scenario's tier in the first restart) and the workload's
   `checkpoint_restore` phase (mean over hosts; it always reads the local tier, after staging).
4. recovery: loss (or kill) detected -> first step completed after the restart (`resumed_at -
   detected_at`) and -> first step beyond the pre-fault high-water mark (`productive_at -
   detected_at`). Target for the peer hot-swap: both <= 15 s, and 0 persistent reads. A fault at
   a multiple of the interval (step 50, the default) is the worst case: it fires as the step
   begins, so the restart restores step 40 and executes steps 41-49 again.

A run fails (the script goes on with the others, then exits 1) when `slicekeeper run` fails or
times out, the fault was not recovered from, the faulted host did not restore from the scenario's
tier, or an expected record kind is missing. Oddities that do not invalidate a figure (copies
missing for some committed steps, failed copies, extra restarts) are listed under the table.
With `--runs N` the scenarios are interleaved (run 1 of each, then run 2 of each, ...) and the table
shows the median, min and max over runs.

    .venv/bin/python benchmarks/checkpoint.py [--runs 1] [--steps 80] [--fault-step 50] [--json out.json]
        [--scenario lose-peer ...]   (only these scenarios; default all six)
        [--framework jax|torch]      (the JAX example job, the default, or the PyTorch one)

Runs, event logs and the table are read and written with benchmarks/harness.py (imported from this
directory, as the other benchmarks do); the scenarios are in checkpoint_scenarios.py, the figures of a
run in checkpoint_figures.py, the table's rows in checkpoint_table.py, next to this script.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml
from checkpoint_figures import RunFigures, analyse, progress_line
from checkpoint_scenarios import CHECKPOINT_INTERVAL, SCENARIOS, Scenario, write_job
from checkpoint_table import build_rows
from harness import (
    FRAMEWORK_JOBS,
    RunFailed,
    finish,
    format_table,
    read_run_report,
    run_once,
    say,
    slicekeeper_command,
    tail,
)

from slicekeeper.api import load_training_job
from slicekeeper.errors import UserError

# --- running ----------------------------------------------------------------------------------------
RUN_DIR_LINE = re.compile(r"run directory: (\S+)")


def run_dir_from_log(log_path: Path) -> str | None:
    """The run directory `slicekeeper run` announced, for a run that left no report."""
    if not log_path.exists():
        return None
    match = RUN_DIR_LINE.search(log_path.read_text(errors="replace"))
    return match.group(1) if match else None


def run_scenario(
    scenario: Scenario, run: int, args: argparse.Namespace, base: dict[str, Any], work: Path
) -> RunFigures:
    """One run of one scenario; RunFailed (with the run directory in its message) if unusable."""
    name = f"{scenario.key}-{run}"
    job_path, report_path, log_path = (
        work / f"{name}.yaml",
        work / f"{name}.report.json",
        work / f"{name}.log",
    )
    write_job(base, scenario, work / f"{name}.persistent", job_path)
    command = [*slicekeeper_command(), "run", str(job_path), "--steps", str(args.steps)]
    command += ["--spares", str(scenario.spares)]  # explicit: the job file may ask for spares
    chaos = scenario.chaos(args.fault_step)
    if chaos:
        command += ["--chaos", chaos]
    command += ["--report", str(report_path)]
    say(f"{scenario.title}, run {run}/{args.runs}: {' '.join(command[1:])}")
    status, seconds, timed_out = run_once(command, log_path, args.timeout, f"  {name}:")
    report: dict[str, Any] | None = None
    try:
        report = read_run_report(report_path, status, timed_out, args.timeout)
        figures = analyse(scenario, run, report, args.fault_step)
        if status != 0:
            raise RunFailed(f"slicekeeper exited with {status}")
    except (RunFailed, json.JSONDecodeError, KeyError, ValueError, TypeError) as error:
        run_dir = (report or {}).get("run_dir") or run_dir_from_log(log_path) or "unknown"
        reason = error if isinstance(error, RunFailed) else f"unreadable report: {error!r}"
        say(f"{scenario.title}, run {run}: FAILED after {seconds:.0f} s: {reason}")
        say(f"    run directory {run_dir}; log {log_path}")
        say("    " + tail(log_path).replace("\n", "\n    "))
        raise RunFailed(f"{scenario.title}, run {run}: {reason}; run directory {run_dir}") from None
    say(f"{scenario.title}, run {run}: ok in {seconds:.0f} s; {progress_line(figures)}")
    for note in figures.notes:
        say(f"    note: {note}")
    return figures


# --- entry ------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Measure the checkpoint tiers: save stall, cost of peer/persistent copies, restore "
        "time by source, hot-swap recovery (local mode, six scenarios per run)."
    )
    parser.add_argument("--runs", type=int, default=1, help="runs per scenario (default 1; medians when >1)")
    parser.add_argument("--steps", type=int, default=80, help="training steps per run (default 80)")
    parser.add_argument(
        "--fault-step",
        type=int,
        help="step at which the kill / lose faults fire (default: 50, or steps - 10 if smaller)",
    )
    parser.add_argument("--job", type=Path, help="TrainingJob YAML (default: the example of --framework)")
    parser.add_argument(
        "--framework",
        choices=sorted(FRAMEWORK_JOBS),
        default="jax",
        help="the example job to measure: the JAX trainer (default) or the PyTorch one",
    )
    parser.add_argument("--json", type=Path, help="write the raw figures of every run and the summary here")
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds before a run is stopped (default 600)"
    )
    parser.add_argument(
        "--scenario",
        dest="scenarios",
        action="append",
        choices=[scenario.key for scenario in SCENARIOS],
        help="run only this scenario (repeatable; default: all six)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep every run's directory and log (default: only failed runs')"
    )
    args = parser.parse_args(argv)
    args.job = args.job or FRAMEWORK_JOBS[args.framework]
    if args.runs < 1 or args.steps < 1:
        parser.error("--runs and --steps must be at least 1")
    keys = args.scenarios or [scenario.key for scenario in SCENARIOS]
    args.scenarios = [scenario for scenario in SCENARIOS if scenario.key in keys]
    if args.fault_step is None:
        args.fault_step = min(50, args.steps - 10)
    if not CHECKPOINT_INTERVAL < args.fault_step < args.steps:
        parser.error(
            f"the fault step ({args.fault_step}) must be after the first save (step {CHECKPOINT_INTERVAL}) "
            f"and before the last step ({args.steps}); raise --steps or set --fault-step"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = yaml.safe_load(args.job.read_text())
    work = Path(tempfile.mkdtemp(prefix="slicekeeper-bench-checkpoint-"))
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    machine = f"{platform.node()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"
    say(
        f"checkpoint benchmark: {len(args.scenarios)} scenario(s) x {args.runs} run(s) "
        f"of {args.steps} steps, "
        f"local save every {CHECKPOINT_INTERVAL} steps, faults at step {args.fault_step}"
    )
    say(f"  started {started_at} on {machine}; load average {os.getloadavg()[0]:.2f}; work dir {work}")

    try:  # a job file `slicekeeper run` would refuse fails here, once, not in every run
        for scenario in args.scenarios:
            path = work / f"{scenario.key}-check.yaml"
            write_job(base, scenario, work / "persistent-check", path)
            load_training_job(path)
    except (UserError, KeyError, TypeError, AttributeError) as error:
        say(f"{args.job} with the scenarios' spec.checkpoint is not a valid TrainingJob: {error}")
        shutil.rmtree(work, ignore_errors=True)
        return 2

    runs: dict[str, list[RunFigures]] = {}
    failures: list[str] = []
    for run in range(1, args.runs + 1):
        for scenario in args.scenarios:
            try:
                figures = run_scenario(scenario, run, args, base, work)
            except RunFailed as error:
                failures.append(str(error))
                continue
            runs.setdefault(scenario.key, []).append(figures)
            if not args.keep:
                shutil.rmtree(figures.run_dir, ignore_errors=True)

    rows = build_rows(runs)
    if rows:
        say("")
        say(
            f"{args.runs} run(s) per scenario, {args.steps} steps each, local save every "
            f"{CHECKPOINT_INTERVAL} steps, faults at step {args.fault_step}; median/min/max over runs"
        )
        say(format_table(rows, args.runs))
    notes = [f"{f.scenario} run {f.run}: {note}" for fs in runs.values() for f in fs for note in f.notes]
    if notes:
        say("")
        say("notes:")
        for note in notes:
            say(f"  {note}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "started_at": started_at,
                    "machine": machine,
                    "cpu_count": os.cpu_count(),
                    "runs_requested": args.runs,
                    "steps": args.steps,
                    "fault_step": args.fault_step,
                    "checkpoint_interval": CHECKPOINT_INTERVAL,
                    "job": str(args.job),
                    "failures": failures,
                    "summary": [row.summary() for row in rows],
                    "runs": {key: [asdict(f) for f in fs] for key, fs in runs.items()},
                },
                indent=1,
            )
        )
        say(f"raw figures: {args.json}")
    if failures:
        say("")
    return finish(failures, work, args.keep)


if __name__ == "__main__":
    sys.exit(main())
