"""Benchmark of the leader hand-over: how long a job is unproductive when its leader's host is lost.

What it measures, over `--runs` local runs of the example TrainingJob (4 host processes and one spare,
CPU devices), each started as `slicekeeper run JOB --steps N --spares 1 --chaos "lose:host=0@step=S"
--report PATH` in a subprocess. Host 0 leads the job at the start; losing it loses the leader, its
workload and its disk at once. Per run, from the moment the machine was lost (the fault's
`fired_at`):

- new leader elected: the report's `leader_changes[0]` (`at`: the new leader has carried on the
  job's memory and acts), and how long the job had no leader (`leaderless_seconds`: from the old
  leader's last renewal seen);
- detected: the lost host recorded as `host_lost` by the new leader (`detected_at`);
- resumed: the first step completed after the restart (`resumed_at`);
- productive: the first step completed beyond the job's high-water mark at the loss
  (`productive_at`), i.e. with the steps executed again.

Target (issue 14): lost -> productive <= 15 s median, the budget of a hot-swap of any other host.
A run fails (exit status 1, after the remaining runs) when `slicekeeper run` fails or times out, the
report shows no leader change, or the fault was not recovered from.

    .venv/bin/python benchmarks/handover.py [--runs 3] [--steps 120] [--lose-at 50] [--json figures.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness import (
    DEFAULT_JOB,
    Row,
    RunFailed,
    finish,
    format_table,
    read_run_report,
    run_once,
    say,
    slicekeeper_command,
    tail,
)

PRODUCTIVE_TARGET_SECONDS = 15.0


@dataclass
class HandoverFigures:
    run: int
    elected_seconds: float
    """Lost -> the new leader carried on the job's memory."""
    leaderless_seconds: float
    """The old leader's last renewal seen -> the new leader carried on (the report's figure)."""
    detected_seconds: float
    resumed_seconds: float
    productive_seconds: float
    new_leader: str
    goodput: float
    wall_seconds: float
    run_dir: str


def analyse(run: int, report: dict[str, Any]) -> HandoverFigures:
    if report.get("state") != "succeeded":
        raise RunFailed(f"job {report.get('state')}: {report.get('failure_reason')}")
    changes = report.get("leader_changes") or []
    if len(changes) != 1:
        raise RunFailed(f"expected one leader change, found {len(changes)}")
    [fault] = [f for f in report["faults"] if f["kind"] == "lose"] or [None]
    if fault is None:
        raise RunFailed("no `lose` fault in the report")
    for key in ("detected_at", "resumed_at", "productive_at"):
        if fault.get(key) is None:
            raise RunFailed(f"the lost leader's host: no {key} in the report")
    lost = float(fault["fired_at"])
    change = changes[0]
    return HandoverFigures(
        run=run,
        elected_seconds=float(change["at"]) - lost,
        leaderless_seconds=float(change["leaderless_seconds"]),
        detected_seconds=float(fault["detected_at"]) - lost,
        resumed_seconds=float(fault["resumed_at"]) - lost,
        productive_seconds=float(fault["productive_at"]) - lost,
        new_leader=f"host {change['to_host']} ({change['to_machine']})",
        goodput=float(report["goodput"]),
        wall_seconds=float(report["wall_seconds"]),
        run_dir=str(report["run_dir"]),
    )


def build_rows(runs: list[HandoverFigures]) -> list[Row]:
    productive = [r.productive_seconds for r in runs]
    return [
        Row("lost -> new leader carried on", [r.elected_seconds for r in runs], "s"),
        Row("job without a leader (report)", [r.leaderless_seconds for r in runs], "s"),
        Row("lost -> detected as host_lost", [r.detected_seconds for r in runs], "s"),
        Row("lost -> resumed (first step)", [r.resumed_seconds for r in runs], "s"),
        Row(
            "lost -> productive (past high-water)",
            productive,
            "s",
            f"median <= {PRODUCTIVE_TARGET_SECONDS:g} s",
            [statistics.median(productive) <= PRODUCTIVE_TARGET_SECONDS] * len(runs),
        ),
        Row("goodput (report)", [r.goodput for r in runs], ""),
        Row("wall time per run", [r.wall_seconds for r in runs], "s"),
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Measure the leader hand-over (local mode).")
    parser.add_argument("--runs", type=int, default=3, help="runs to measure (default 3)")
    parser.add_argument("--steps", type=int, default=120, help="training steps per run (default 120)")
    parser.add_argument("--lose-at", type=int, default=50, help="step at which host 0 is lost (default 50)")
    parser.add_argument(
        "--job", type=Path, default=DEFAULT_JOB, help="TrainingJob YAML (default: the example)"
    )
    parser.add_argument("--json", type=Path, help="write the raw figures of every run and the summary here")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a run is stopped")
    parser.add_argument("--keep", action="store_true", help="keep every run's directory and log")
    args = parser.parse_args(argv)
    if args.runs < 1 or not 1 <= args.lose_at < args.steps:
        parser.error("--runs must be at least 1 and --lose-at a step before --steps")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="slicekeeper-bench-"))
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    machine = f"{platform.node()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"
    chaos = f"lose:host=0@step={args.lose_at}"
    say(f"hand-over benchmark: {args.runs} run(s) of {args.steps} steps, one spare, chaos '{chaos}'")
    say(f"  started {started_at} on {machine}; load average {os.getloadavg()[0]:.2f}; work dir {work}")
    figures: list[HandoverFigures] = []
    failures: list[str] = []
    keep_work = args.keep
    for run in range(1, args.runs + 1):
        report_path, log_path = work / f"report-{run}.json", work / f"run-{run}.log"
        command = [
            *slicekeeper_command(),
            "run",
            str(args.job),
            "--steps",
            str(args.steps),
            "--spares",
            "1",
            "--chaos",
            chaos,
            "--report",
            str(report_path),
        ]
        say(f"run {run}/{args.runs}: {' '.join(command[1:])}")
        status, seconds, timed_out = run_once(command, log_path, args.timeout, f"  run {run}:")
        report: dict[str, Any] | None = None
        try:
            report = read_run_report(report_path, status, timed_out, args.timeout)
            run_figures = analyse(run, report)
            if status != 0:
                raise RunFailed(f"slicekeeper exited with {status}")
        except RunFailed as error:
            where = f"; run directory {report['run_dir']}" if report and report.get("run_dir") else ""
            failures.append(f"run {run}: {error}{where}")
            keep_work = True
            say(f"run {run}/{args.runs}: FAILED after {seconds:.0f} s: {error}; log {log_path}")
            say("    " + tail(log_path).replace("\n", "\n    "))
            continue
        figures.append(run_figures)
        say(
            f"run {run}/{args.runs}: ok in {seconds:.0f} s; new leader {run_figures.new_leader} "
            f"{run_figures.elected_seconds:.2f} s after the loss; productive again after "
            f"{run_figures.productive_seconds:.2f} s"
        )
        if not args.keep:
            shutil.rmtree(run_figures.run_dir, ignore_errors=True)
    rows = build_rows(figures) if figures else []
    if rows:
        say("")
        say(f"{len(figures)} of {args.runs} run(s), {args.steps} steps each; median/min/max over runs")
        say(format_table(rows, len(figures)))
    if args.json:
        summary = {
            "started_at": started_at,
            "machine": machine,
            "runs_requested": args.runs,
            "steps": args.steps,
            "chaos": chaos,
            "failures": failures,
            "summary": [row.summary() for row in rows],
            "runs": [asdict(f) for f in figures],
        }
        args.json.write_text(json.dumps(summary, indent=1))
    return finish(failures, work, keep_work)


if __name__ == "__main__":
    raise SystemExit(main())
