"""Benchmark of the leader hand-over: how long a job is unproductive when its leader is lost.

What it measures, over `--runs` local runs of the example TrainingJob (4 host processes, CPU devices),
each started as `slicekeeper run JOB --steps N [--spares 1] --chaos "FAULT:host=0@step=S" --report
PATH` in a subprocess. Host 0 leads the job at the start. Two ways to lose it (`--fault`):

- `lose` (the default, with one spare): host 0's machine is gone, leader, workload and disk at once;
  another host is elected, the spare takes host 0 over. Target (issue 14): <= 15 s median, the
  budget of a hot-swap of any other host.
- `crash-supervisor`: only host 0's supervisor process dies (its workload with it), the machine is
  intact; the local runtime starts the supervisor again, which releases its predecessor's lease and
  a leader is elected at once; every host restores from its own disk. Target: <= 10 s median.

Per run, from the moment of the fault (its `fired_at`):
- new leader elected: the report's `leader_changes[0]` (`at`: the new leader has carried on the
  job's memory and acts), and how long the job had no leader (`leaderless_seconds`: from the old
  leader's last renewal);
- detected: the restart recorded by the new leader (`detected_at`: host_lost, or crash);
- resumed: the first step completed after the restart (`resumed_at`);
- productive: the first step completed beyond the job's high-water mark at the fault
  (`productive_at`), i.e. with the steps executed again.

A run fails (exit status 1, after the remaining runs) when `slicekeeper run` fails or times out, the
report shows no leader change, or the fault was not recovered from.

    .venv/bin/python benchmarks/handover.py [--fault lose|crash-supervisor] [--runs 3] [--steps 120]
        [--at 50] [--json figures.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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
    measure_runs,
    say,
    slicekeeper_command,
)

PRODUCTIVE_TARGET_SECONDS = {"lose": 15.0, "crash-supervisor": 10.0}
"""Fault -> productive again within this many seconds (median)."""
DETECTED_AS = {"lose": "host_lost", "crash-supervisor": "crash"}
SPARES = {"lose": 1, "crash-supervisor": 0}


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


def analyse(run: int, report: dict[str, Any], kind: str) -> HandoverFigures:
    if report.get("state") != "succeeded":
        raise RunFailed(f"job {report.get('state')}: {report.get('failure_reason')}")
    changes = report.get("leader_changes") or []
    if len(changes) != 1:
        raise RunFailed(f"expected one leader change, found {len(changes)}")
    [fault] = [f for f in report["faults"] if f["kind"] == kind] or [None]
    if fault is None:
        raise RunFailed(f"no `{kind}` fault in the report")
    if fault.get("detected_as") != DETECTED_AS[kind]:
        raise RunFailed(f"the fault was detected as {fault.get('detected_as')}, not {DETECTED_AS[kind]}")
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


def build_rows(runs: list[HandoverFigures], kind: str) -> list[Row]:
    productive = [r.productive_seconds for r in runs]
    target = PRODUCTIVE_TARGET_SECONDS[kind]
    return [
        Row("fault -> new leader carried on", [r.elected_seconds for r in runs], "s"),
        Row("job without a leader (report)", [r.leaderless_seconds for r in runs], "s"),
        Row(f"fault -> detected as {DETECTED_AS[kind]}", [r.detected_seconds for r in runs], "s"),
        Row("fault -> resumed (first step)", [r.resumed_seconds for r in runs], "s"),
        Row(
            "fault -> productive (past high-water)",
            productive,
            "s",
            f"median <= {target:g} s",
            [statistics.median(productive) <= target] * len(runs),
        ),
        Row("goodput (report)", [r.goodput for r in runs], ""),
        Row("wall time per run", [r.wall_seconds for r in runs], "s"),
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Measure the leader hand-over (local mode).")
    parser.add_argument("--runs", type=int, default=3, help="runs to measure (default 3)")
    parser.add_argument("--steps", type=int, default=120, help="training steps per run (default 120)")
    parser.add_argument(
        "--fault", choices=sorted(PRODUCTIVE_TARGET_SECONDS), default="lose", help="how the leader is lost"
    )
    parser.add_argument("--at", type=int, default=50, help="step at which host 0 is hit (default 50)")
    parser.add_argument(
        "--job", type=Path, default=DEFAULT_JOB, help="TrainingJob YAML (default: the example)"
    )
    parser.add_argument("--json", type=Path, help="write the raw figures of every run and the summary here")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a run is stopped")
    parser.add_argument("--keep", action="store_true", help="keep every run's directory and log")
    args = parser.parse_args(argv)
    if args.runs < 1 or not 1 <= args.at < args.steps:
        parser.error("--runs must be at least 1 and --at a step before --steps")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="slicekeeper-bench-"))
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    machine = f"{platform.node()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"
    chaos, spares = f"{args.fault}:host=0@step={args.at}", SPARES[args.fault]
    say(f"hand-over benchmark: {args.runs} run(s) of {args.steps} steps, {spares} spare(s), chaos '{chaos}'")
    say(f"  started {started_at} on {machine}; load average {os.getloadavg()[0]:.2f}; work dir {work}")

    def command(report_path: Path) -> list[str]:
        options = ["--steps", str(args.steps), "--spares", str(spares), "--chaos", chaos]
        return [*slicekeeper_command(), "run", str(args.job), *options, "--report", str(report_path)]

    def describe(run: HandoverFigures) -> str:
        return (
            f"new leader {run.new_leader} {run.elected_seconds:.2f} s after the fault; productive again "
            f"after {run.productive_seconds:.2f} s"
        )

    measured = measure_runs(
        args.runs,
        command,
        lambda run, report: analyse(run, report, args.fault),
        work=work,
        timeout=args.timeout,
        keep=args.keep,
        describe=describe,
    )
    figures = measured.figures
    rows = build_rows(figures, args.fault) if figures else []
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
            "spares": spares,
            "failures": measured.failures,
            "summary": [row.summary() for row in rows],
            "runs": [asdict(f) for f in figures],
        }
        args.json.write_text(json.dumps(summary, indent=1))
    return finish(measured.failures, work, measured.keep)


if __name__ == "__main__":
    raise SystemExit(main())
