"""Benchmark of the policy signals: straggler detection latency, false stragglers, elastic scale-down.

Why: the default policy acts on two signals that have no exit code behind them, a host found
straggling and a host gone with no spare to replace it. How soon a slow host is singled out, whether
a healthy job is ever accused, and how long a job scaled down by a slice takes to train again are
the figures issue 4 sets targets for; this script measures them on the reference JAX job, so a change
to the detector, the throttle or the elastic restart shows up as a number.

It runs the example job (`examples/trainingjob.yaml`: 2 slices x 2 hosts, 4 host processes x 2 CPU
devices) as subprocesses `slicekeeper run JOB --steps N --spares 0 [--chaos ...] --report PATH`,
always without a spare, so that a straggler is only reported (with a spare the default policy would
replace it) and a lost host costs its slice:

- `slow-1.5`, `slow-2`: `slow:host=2,factor=F@step=30`. Detection latency in steps is the report's
  `stragglers[].step` of host 2 (the step whose timings completed the detection) minus 30, in seconds
  the `slow` fault's `detected_at - fired_at`. Targets: 1.5x within 30 steps, 2x within 15. A run in
  which host 2 is never flagged counts as "never" (target missed). Also shown: the slowdown the
  throttle really produced (host 2's own work per step over the other hosts', median over the steps
  after 30; the chaos duty-cycles the process, which a loaded machine can partly undo), the score
  host 2 had when flagged, and the highest score any *other* host reached (they wait for host 2 in
  the collectives: their scores must stay low).
- `healthy`: no chaos, long enough for 5 minutes of training (steps = 1.15 x 300 s / the median step
  time measured in the slow runs before their slowdown, or `--healthy-steps`). Targets: no straggler
  flagged and no restart (no false alarm: a hang report the leader does not confirm is counted, not
  a restart). The training time (first to last completed step) is checked against the 5 minutes.
  `--healthy-only --hosts 16 --devices-per-host 1` runs it alone on a wider world.
- `scale-down`: `lose:host=3@step=40`. With no spare the default policy drops slice 1 (hosts 2 and
  3) and hosts 0 and 1 continue from the newest checkpoint. Figures from the `lose` fault: lost ->
  detected, detected -> first step after the restart (resumed), detected -> first step beyond the
  pre-fault high-water mark (productive; target <= 20 s); and the report's `scale_events` must hold
  one `down` from 4 to 2 hosts.

Scores. The leader keeps its hosts' straggler scores in memory, not in the report, so the script
replays them: every host's `events.jsonl` holds each step's own `work` (the SDK's `work_done()` mark,
what the leader scores), and feeding those to the leader's own `StragglerDetector` (same defaults,
one detector per restart generation, reports in time order) gives the scores the leader computed,
up to the order in which reports arrived. A replayed detection that differs from the report's is
listed as a note. Machine directories are `host-N/` (no spare, so machine N always serves host N).

The slow and scale-down scenarios run `--runs` times, interleaved; the healthy one once, last. The
table shows the median, min and max over runs; a target is met when every run meets it. A run fails
(the script goes on, then exits 1) when `slicekeeper run` fails or times out, or the loss was not
detected or recovered from; a missed target is a figure, not a failure.

    .venv/bin/python benchmarks/policy.py [--runs 3] [--quick] [--skip-healthy] [--json out.json]
    .venv/bin/python benchmarks/policy.py --healthy-only --hosts 16 --devices-per-host 1 --healthy-minutes 2

Runs, event logs and the table are read and written with benchmarks/harness.py (imported from this
directory, as the other benchmarks do); the scenarios are in policy_scenarios.py, the figures of a run
in policy_figures.py, the table in policy_table.py, next to this script.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness import (
    DEFAULT_JOB,
    RunFailed,
    finish,
    read_run_report,
    run_once,
    say,
    slicekeeper_command,
    tail,
)
from policy_figures import RunFigures, analyse, progress_line
from policy_scenarios import (
    FALLBACK_STEP_SECONDS,
    HEALTHY,
    HEALTHY_MARGIN,
    HEALTHY_MINUTES,
    LOSE_STEP,
    LOST_HOST,
    SCALE_DOWN,
    SLOW_HOST,
    SLOW_SCENARIOS,
    SLOW_STEP,
    Scenario,
)
from policy_table import build_rows, format_rows


# --- running ----------------------------------------------------------------------------------------
def run_scenario(
    scenario: Scenario, run: int, runs: int, steps: int, args: argparse.Namespace, work: Path
) -> RunFigures:
    """One run of one scenario; RunFailed (with the run directory in its message) if unusable."""
    name = f"{scenario.key}-{run}"
    report_path, log_path = work / f"{name}.report.json", work / f"{name}.log"
    command = [*slicekeeper_command(), "run", str(args.job), "--steps", str(steps), "--spares", "0"]
    if args.hosts is not None:
        command += ["--hosts", str(args.hosts)]
    if args.devices_per_host is not None:
        command += ["--devices-per-host", str(args.devices_per_host)]
    if scenario.chaos:
        command += ["--chaos", scenario.chaos]
    command += ["--report", str(report_path)]
    load = os.getloadavg()[0]
    say(f"{scenario.key}, run {run}/{runs} (load {load:.1f}): {' '.join(command[1:])}")
    status, seconds, timed_out = run_once(command, log_path, args.timeout, f"  {name}:")
    report: dict[str, Any] | None = None
    try:
        report = read_run_report(report_path, status, timed_out, args.timeout)
        figures = analyse(scenario, run, report, load)
        figures.unconfirmed_hangs = log_path.read_text(errors="replace").count(" not confirmed: ")
        if status != 0:
            raise RunFailed(f"slicekeeper exited with {status}")
    except (RunFailed, json.JSONDecodeError, KeyError, ValueError, TypeError) as error:
        run_dir = (report or {}).get("run_dir") or "unknown (see the log)"
        reason = error if isinstance(error, RunFailed) else f"unreadable report: {error!r}"
        say(f"{scenario.key}, run {run}: FAILED after {seconds:.0f} s: {reason}")
        say(f"    run directory {run_dir}; log {log_path}")
        say("    " + tail(log_path).replace("\n", "\n    "))
        raise RunFailed(f"{scenario.key}, run {run}: {reason}; run directory {run_dir}") from None
    say(f"{scenario.key}, run {run}: ok in {seconds:.0f} s; {progress_line(figures)}")
    for note in figures.notes:
        say(f"    note: {note}")
    return figures


def healthy_steps(args: argparse.Namespace, runs: dict[str, list[RunFigures]]) -> int:
    if args.healthy_steps is not None:
        steps: int = args.healthy_steps
        return steps
    measured = [f.step_seconds for s in SLOW_SCENARIOS for f in runs.get(s.key, [])]
    step = statistics.median(measured) if measured else FALLBACK_STEP_SECONDS
    minutes: float = args.healthy_minutes
    return math.ceil(HEALTHY_MARGIN * minutes * 60 / step)


# --- entry ------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Measure straggler detection latency, false stragglers in a healthy run and the "
        "elastic scale-down's recovery (local mode, no spare)."
    )
    parser.add_argument("--runs", type=int, help="runs of the slow and scale-down scenarios (default 3)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 run each, shorter runs, a 2-minute healthy run (a smoke test of the figures)",
    )
    parser.add_argument("--skip-healthy", action="store_true", help="leave out the healthy run")
    parser.add_argument(
        "--healthy-only", action="store_true", help="only the healthy run (the no-false-alarm run)"
    )
    parser.add_argument(
        "--hosts",
        type=int,
        help="local host processes of every run (default: the job's; other than 4 with --healthy-only "
        "only: the slow and scale-down scenarios are written for the example's 2 x 2 hosts)",
    )
    parser.add_argument("--devices-per-host", type=int, help="CPU devices per host of every run")
    parser.add_argument(
        "--healthy-minutes",
        type=float,
        help=f"training time of the healthy run (default {HEALTHY_MINUTES:g}; --quick: 2)",
    )
    parser.add_argument(
        "--healthy-steps", type=int, help="steps of the healthy run (default: from the measured step time)"
    )
    parser.add_argument(
        "--job", type=Path, default=DEFAULT_JOB, help="TrainingJob YAML (default: the example)"
    )
    parser.add_argument("--json", type=Path, help="write the raw figures of every run and the summary here")
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="seconds before a run is stopped (default 900)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep every run's directory and log (default: only failed runs')"
    )
    args = parser.parse_args(argv)
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    if args.healthy_minutes is None:
        args.healthy_minutes = 2.0 if args.quick else HEALTHY_MINUTES
    args.slow_steps = SLOW_STEP + (40 if args.quick else 50)
    args.scale_down_steps = LOSE_STEP + (20 if args.quick else 30)
    if (
        args.runs < 1
        or args.healthy_minutes <= 0
        or (args.healthy_steps is not None and args.healthy_steps < 1)
        or (args.hosts is not None and args.hosts < 1)
        or (args.devices_per_host is not None and args.devices_per_host < 1)
    ):
        parser.error(
            "--runs, --healthy-minutes, --healthy-steps, --hosts and --devices-per-host must be positive"
        )
    if args.healthy_only and args.skip_healthy:
        parser.error("--healthy-only and --skip-healthy leave nothing to run")
    if args.hosts not in (None, 4) and not args.healthy_only:
        parser.error("--hosts other than 4 needs --healthy-only: the other scenarios are written for 4 hosts")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="slicekeeper-bench-policy-"))
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    started = time.monotonic()
    machine = f"{platform.node()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"
    world = "" if args.hosts is None else f" on {args.hosts} hosts"
    healthy = "no healthy run" if args.skip_healthy else f"one healthy run of {args.healthy_minutes:g} min"
    if args.healthy_only:
        say(f"policy benchmark: {healthy}{world}")
    else:
        say(
            f"policy benchmark: {args.runs} run(s) of slow 1.5x / 2x ({args.slow_steps} steps, host "
            f"{SLOW_HOST} from step {SLOW_STEP}) and scale-down ({args.scale_down_steps} steps, lose host "
            f"{LOST_HOST} at step {LOSE_STEP}), {healthy}{world}"
        )
    say(f"  started {started_at} on {machine}; load average {os.getloadavg()[0]:.2f}; work dir {work}")

    runs: dict[str, list[RunFigures]] = {}
    failures: list[str] = []
    plan = [(s, args.slow_steps) for s in SLOW_SCENARIOS] + [(SCALE_DOWN, args.scale_down_steps)]
    for run in range(1, 0 if args.healthy_only else args.runs + 1):
        for scenario, steps in plan:
            try:
                figures = run_scenario(scenario, run, args.runs, steps, args, work)
            except RunFailed as error:
                failures.append(str(error))
                continue
            runs.setdefault(scenario.key, []).append(figures)
            if not args.keep:
                shutil.rmtree(figures.run_dir, ignore_errors=True)
    if not args.skip_healthy:
        steps = healthy_steps(args, runs)
        try:
            figures = run_scenario(HEALTHY, 1, 1, steps, args, work)
            runs[HEALTHY.key] = [figures]
            if not args.keep:
                shutil.rmtree(figures.run_dir, ignore_errors=True)
        except RunFailed as error:
            failures.append(str(error))

    healthy_seconds = args.healthy_minutes * 60
    rows = build_rows(runs, healthy_seconds)
    elapsed = time.monotonic() - started
    if rows:
        say("")
        runs_said = (
            "the healthy run only"
            if args.healthy_only
            else f"{args.runs} run(s) per slow / scale-down scenario"
        )
        say(f"{runs_said}, --spares 0; median/min/max over runs; benchmark took {elapsed / 60:.1f} min")
        say(format_rows(rows))
    notes = [f"{f.scenario} run {f.run}: {note}" for fs in runs.values() for f in fs for note in f.notes]
    decisions = [
        f"{f.scenario} run {f.run}: {'; '.join(f.decisions)}"
        for fs in runs.values()
        for f in fs
        if f.decisions
    ]
    loads = [f.load_average for fs in runs.values() for f in fs]
    if loads:
        say("")
        say(
            f"load average at the start of the runs: {min(loads):.1f} to {max(loads):.1f} "
            f"({os.cpu_count()} cores)"
        )
    if notes:
        say("notes:")
        for note in notes:
            say(f"  {note}")
    if decisions:
        say("decisions:")
        for line in decisions:
            say(f"  {line}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "started_at": started_at,
                    "machine": machine,
                    "cpu_count": os.cpu_count(),
                    "seconds": elapsed,
                    "runs_requested": args.runs,
                    "quick": args.quick,
                    "job": str(args.job),
                    "hosts": args.hosts,
                    "devices_per_host": args.devices_per_host,
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
