"""What an announced loss saves: the same host lost at the same step, without a word, with a
maintenance notice, with a preemption's grace, and cut off by a silent partition.

Each scenario runs the example job (`slicekeeper run`, a spare for the hot-swap) `--runs` times with
one fault on host 1 at step `--at`, and reads each run's report: the steps trained again, the badput
the loss caused (wasted progress, infrastructure recovery) and in all, the goodput, and the fault's
detection and recovery times (for the partition, the detection time is the connection deadline at
work: spec.health.connectionDeadlineSeconds). Every run must end with the same parameters (the
fingerprint of the first run): a scenario that only looks cheaper because it lost work fails.

    python -m benchmarks.announced --runs 3

Figures and the command are in docs/benchmarks.md ("Announced losses"). The partition scenario needs
root and nftables' `nft` (chaos `partition`); without them it is skipped, and said so.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import DEFAULT_JOB, RunFailed, finish, measure_runs, say, slicekeeper_command


@dataclass
class LossFigures:
    run: int
    run_dir: str
    fingerprint: str
    steps_again: int
    wasted_progress: float
    infrastructure_recovery: float
    badput: float
    goodput: float
    detection_seconds: float
    recovery_seconds: float


def scenarios(at: int, notice: float, grace: float) -> dict[str, str]:
    """The chaos of each scenario, all on host 1 at step `at`."""
    return {
        "unannounced loss": f"lose:host=1@step={at}",
        "maintenance": f"maintenance:host=1,notice={notice:g}@step={at}",
        "preemption": f"preempt:host=1,grace={grace:g}@step={at}",
        "silent partition": f"partition:host=1@step={at}",
    }


def analyse(run: int, report: dict[str, Any]) -> LossFigures:
    if report["state"] != "succeeded":
        raise RunFailed(f"the job ended {report['state']}: {report.get('failure_reason')}")
    [fault] = report["faults"]
    if fault["detection_seconds"] is None or fault["recovery_seconds"] is None:
        raise RunFailed(f"fault {fault['kind']} was not detected and recovered: {fault}")
    recoveries = [r for r in report["recoveries"] if r["cause"] != "resume"]
    badput = report["badput_seconds"]
    return LossFigures(
        run=run,
        run_dir=report["run_dir"],
        fingerprint=report["params_fingerprint"],
        steps_again=sum(r.get("steps_replayed") or 0 for r in recoveries),
        wasted_progress=badput.get("wasted_progress", 0.0),
        infrastructure_recovery=badput.get("infrastructure_recovery", 0.0),
        badput=sum(badput.values()),
        goodput=report["goodput"],
        detection_seconds=fault["detection_seconds"],
        recovery_seconds=fault["recovery_seconds"],
    )


COLUMNS = (
    ("steps again", "steps_again", "{:.0f}"),
    ("wasted progress (s)", "wasted_progress", "{:.2f}"),
    ("infra. recovery (s)", "infrastructure_recovery", "{:.2f}"),
    ("badput, all (s)", "badput", "{:.2f}"),
    ("goodput", "goodput", "{:.3f}"),
    ("detected after (s)", "detection_seconds", "{:.2f}"),
    ("training again after (s)", "recovery_seconds", "{:.2f}"),
)


def table(results: dict[str, list[LossFigures]]) -> str:
    """Medians per scenario, as a Markdown table."""
    header = ["scenario", "runs", *(name for name, _, _ in COLUMNS)]
    lines = [header]
    for scenario, figures in results.items():
        cells = [scenario, str(len(figures))]
        for _, field, form in COLUMNS:
            cells.append(
                form.format(statistics.median(getattr(f, field) for f in figures)) if figures else "-"
            )
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + " |" for line in lines]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per scenario (default 3)")
    parser.add_argument("--steps", type=int, default=120, help="training steps per run (default 120)")
    parser.add_argument("--at", type=int, default=34, help="the step the loss comes at (default 34)")
    parser.add_argument("--notice", type=float, default=30.0, help="maintenance notice, seconds (default 30)")
    parser.add_argument("--grace", type=float, default=10.0, help="preemption grace, seconds (default 10)")
    parser.add_argument(
        "--job", type=Path, default=DEFAULT_JOB, help="TrainingJob YAML (default: the example)"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a run is stopped")
    parser.add_argument("--keep", action="store_true", help="keep every run's directory and log")
    args = parser.parse_args(argv)
    if args.runs < 1 or not 1 <= args.at < args.steps:
        parser.error("--runs must be at least 1, and --at a step of the run (1 .. --steps - 1)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="slicekeeper-announced-"))
    say(
        f"announced losses: {args.runs} run(s) of {args.steps} steps per scenario, "
        f"host 1 lost at step {args.at}"
    )
    results: dict[str, list[LossFigures]] = {}
    failures: list[str] = []
    keep = args.keep
    fingerprints: set[str] = set()
    for scenario, chaos in scenarios(args.at, args.notice, args.grace).items():
        if chaos.startswith("partition") and (os.geteuid() != 0 or shutil.which("nft") is None):
            say(f"{scenario}: skipped (chaos partition takes root and nftables' nft)")
            continue
        folder = work / scenario.replace(" ", "-")
        folder.mkdir()

        def command(report_path: Path, chaos: str = chaos) -> list[str]:
            return [
                *slicekeeper_command(),
                *("run", str(args.job), "--steps", str(args.steps), "--spares", "1"),
                *("--chaos", chaos, "--report", str(report_path), "--progress", "plain"),
            ]

        def describe(f: LossFigures) -> str:
            return (
                f"{f.steps_again} step(s) again, wasted {f.wasted_progress:.2f} s, badput {f.badput:.2f} s, "
                f"detected after {f.detection_seconds:.2f} s"
            )

        say(f"{scenario}: --chaos {chaos}")
        measured = measure_runs(
            args.runs, command, analyse, work=folder, timeout=args.timeout, keep=args.keep, describe=describe
        )
        failures += [f"{scenario} {failure}" for failure in measured.failures]
        keep = keep or measured.keep
        results[scenario] = measured.figures
        fingerprints |= {f.fingerprint for f in measured.figures}
    if len(fingerprints) > 1:
        failures.append(
            f"the runs ended with {len(fingerprints)} different parameter fingerprints: {fingerprints}"
        )
    say("")
    say(f"medians over the runs; host 1 lost at step {args.at} of {args.steps} ({args.job.name})")
    say(table(results))
    return finish(failures, work, keep)


if __name__ == "__main__":
    sys.exit(main())
