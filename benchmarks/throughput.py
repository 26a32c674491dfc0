"""Benchmark of a fault-free run's steps per second: this checkout against an older commit, side by side.

Issue 18 asks for the speed of training before and after its changes measured in one benchmark run,
so that the machine's noise cancels. `--baseline REV` is checked out into a temporary git worktree
and installed (its package only, no dependencies) into a temporary folder that goes first on
PYTHONPATH for its runs; both use this environment's interpreter and libraries. Then `--runs` rounds,
each one fault-free `slicekeeper run JOB --steps N` of the baseline and one of this checkout, the
order alternating from round to round. Each tree has its own compilation cache folder.

Per run, from the hosts' events.jsonl: steady steps per second (steps 11 -> N over the time between
their ends, median over hosts, so start-up and compilation are left out), wall seconds of the whole
`slicekeeper run`, and the trainers' user and system CPU seconds per host-step (harness.TrainerCpu).

    .venv/bin/python benchmarks/throughput.py --baseline REV [--runs 3] [--steps 200] [--job PATH]

Prints a table per tree (median, min, max) and the ratio of the medians. Fails (exit 1) when a run
fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import (
    FRAMEWORK_JOBS,
    REPO,
    Row,
    RunFailed,
    TrainerCpu,
    format_table,
    read_events,
    read_run_report,
    run_once,
    say,
    slicekeeper_command,
)

WARM_STEPS = 10
"""Steps left out at the start of a run: compilation and the first steps' warm-up."""


@dataclass
class Tree:
    """A version of slicekeeper to run: its name, what goes on PYTHONPATH, its compilation cache."""

    name: str
    python_path: str | None
    cache: Path


@dataclass
class RunFigures:
    steps_per_second: float
    wall_seconds: float
    user_cpu_per_step: float
    system_cpu_per_step: float


def install_baseline(rev: str, work: Path) -> Path:
    """`rev` checked out into a worktree under `work` and its package installed beside it; the folder
    to put on PYTHONPATH."""
    tree, site = work / "baseline-tree", work / "baseline-site"
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=REPO, capture_output=True, text=True
    )
    if commit.returncode != 0:
        raise SystemExit(f"--baseline: {rev!r} is not a commit of {REPO}: {commit.stderr.strip()}")
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(tree), commit.stdout.strip()], cwd=REPO, check=True
    )
    say(f"baseline {rev} ({commit.stdout.strip()[:12]}): installing into {site}")
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "--target", str(site), str(tree)], check=True)
    return site


def steady_steps_per_second(run_dir: Path, steps: int) -> float:
    """Median over hosts of (steps after the warm-up) / (time between their ends)."""
    rates = []
    for path in sorted(run_dir.glob("host-*/events.jsonl")):
        ends = {
            int(e["step"]): float(e["t"])
            for e in read_events(path)
            if e.get("source") == "workload" and e.get("type") == "step_end"
        }
        if WARM_STEPS in ends and steps in ends and ends[steps] > ends[WARM_STEPS]:
            rates.append((steps - WARM_STEPS) / (ends[steps] - ends[WARM_STEPS]))
    if not rates:
        raise RunFailed(f"no host completed steps {WARM_STEPS} and {steps} in {run_dir}")
    return statistics.median(rates)


def run(tree: Tree, job: Path, steps: int, work: Path, index: int) -> RunFigures:
    report_path, log_path = work / f"{tree.name}-{index}.json", work / f"{tree.name}-{index}.log"
    argv = [*slicekeeper_command(), "run", str(job), "--steps", str(steps), "--report", str(report_path)]
    environ = dict(os.environ, SLICEKEEPER_COMPILATION_CACHE=str(tree.cache))
    if tree.python_path:
        environ["PYTHONPATH"] = tree.python_path
    cpu = TrainerCpu()
    cpu.start()
    status, seconds, timed_out = run_once(argv, log_path, 900, f"  {tree.name} {index}:", env=environ)
    user, system = cpu.stop()
    report = read_run_report(report_path, status, timed_out, 900)
    if status != 0 or report.get("state") != "succeeded":
        raise RunFailed(f"{tree.name} run {index}: {report.get('state')}: {report.get('failure_reason')}")
    run_dir = Path(report["run_dir"])
    host_steps = sum(
        1
        for path in run_dir.glob("host-*/events.jsonl")
        for e in read_events(path)
        if e.get("source") == "workload" and e.get("type") == "step_end"
    )
    figures = RunFigures(
        steps_per_second=steady_steps_per_second(run_dir, steps),
        wall_seconds=seconds,
        user_cpu_per_step=user / host_steps,
        system_cpu_per_step=system / host_steps,
    )
    shutil.rmtree(run_dir, ignore_errors=True)
    say(
        f"  {tree.name} {index}: {figures.steps_per_second:.2f} steps/s, {seconds:.0f} s, CPU per host-step "
        f"user {1000 * figures.user_cpu_per_step:.1f} ms, system {1000 * figures.system_cpu_per_step:.1f} ms"
    )
    return figures


def rows(figures: list[RunFigures]) -> list[Row]:
    return [
        Row("steady steps per second", [f.steps_per_second for f in figures], ""),
        Row("wall time of the run", [f.wall_seconds for f in figures], "s"),
        Row("trainers' user CPU per host-step", [1000 * f.user_cpu_per_step for f in figures], "ms"),
        Row("trainers' system CPU per host-step", [1000 * f.system_cpu_per_step for f in figures], "ms"),
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Fault-free steps per second: this checkout against REV.")
    parser.add_argument("--baseline", required=True, help="the commit to compare with (any git revision)")
    parser.add_argument("--runs", type=int, default=3, help="rounds, each one run of each tree (default 3)")
    parser.add_argument("--steps", type=int, default=200, help="steps per run (default 200)")
    parser.add_argument("--job", type=Path, default=FRAMEWORK_JOBS["jax"], help="TrainingJob YAML")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.steps <= WARM_STEPS:
        parser.error(f"--runs must be at least 1 and --steps above {WARM_STEPS}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="slicekeeper-throughput-"))
    results: dict[str, list[RunFigures]] = {"baseline": [], "current": []}
    try:
        trees = [
            Tree("baseline", str(install_baseline(args.baseline, work)), work / "cache-baseline"),
            Tree("current", None, work / "cache-current"),
        ]
        say(f"throughput: {args.runs} round(s) of {args.steps} fault-free steps, {args.job}")
        for index in range(1, args.runs + 1):
            for tree in trees if index % 2 else reversed(trees):
                results[tree.name].append(run(tree, args.job, args.steps, work, index))
    except RunFailed as error:
        say(f"FAILED: {error}")
        return 1
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(work / "baseline-tree")], cwd=REPO)
        shutil.rmtree(work, ignore_errors=True)
    for name, figures in results.items():
        say("")
        say(f"{name} ({args.baseline if name == 'baseline' else 'this checkout'}): median/min/max")
        say(format_table(rows(figures), len(figures)))
    ratio: Any = statistics.median(f.steps_per_second for f in results["current"]) / statistics.median(
        f.steps_per_second for f in results["baseline"]
    )
    say("")
    say(f"steady steps per second, this checkout / {args.baseline}: {ratio:.2f}x (medians)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
