"""The fleet simulator against real runs: local runs with several fault mixes, each predicted by
`slicekeeper simulate JOB --replay REPORT` from its own measured costs and from another run's.

Two runs of the JAX example job (the demo's mix, and a lost host, a crash and an announced loss that
ends in a scale-down) and four of the SDK example loop (a ladder of crash, lost host, announced loss
and crash; the elastic episode of a user policy; a lost host with no spare; four crashes). Each
prints its measured goodput, the prediction from its own costs, and the prediction from the recovery
costs of another run (the model not tuned on the run it predicts). The issue's bar: within 0.03.

    python -m benchmarks.simulator_validation             # every run, about 4 minutes
    python -m benchmarks.simulator_validation --only sdk  # the SDK loop's runs
    python -m benchmarks.simulator_validation --work DIR --replay-only  # replay the runs kept in DIR

The figures and the command are in docs/simulator.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks.harness import DEFAULT_JOB, REPO, run_once, say, slicekeeper_command

NO_HOT_SWAP = str(REPO / "examples" / "policies" / "no_hot_swap.py")
TOLERANCE = 0.03


@dataclass(frozen=True)
class Mix:
    name: str
    workload: str
    """jax: the example job; sdk: the SDK example loop (50 ms steps)."""
    chaos: str
    steps: int
    costs_from: str
    """The run whose recovery costs predict this one in the second column."""
    spares: int = 0
    policy: str | None = None


MIXES = (
    Mix(
        "jax demo", "jax", "kill:host=1@step=150,lose:host=0@step=300,hang:host=0@step=450", 600, "jax mix", 1
    ),
    Mix(
        "jax mix",
        "jax",
        "lose:host=2@step=100,kill:host=3@step=250,maintenance:host=1,notice=1@step=320",
        400,
        "jax demo",
        1,
    ),
    Mix(
        "sdk ladder",
        "sdk",
        "kill:host=0@step=30,lose:host=3@step=70,maintenance:host=1,notice=1@step=110,kill:host=2@step=150",
        200,
        "sdk elastic",
        1,
    ),
    Mix("sdk elastic", "sdk", "lose:host=3@step=40,spare:+1@step=60", 120, "sdk ladder", 1, NO_HOT_SWAP),
    Mix("sdk no spare", "sdk", "lose:host=2@step=50,kill:host=0@step=120", 200, "sdk ladder"),
    Mix(
        "sdk crashes",
        "sdk",
        "kill:host=0@step=30,kill:host=2@step=70,kill:host=1@step=110,kill:host=3@step=150",
        200,
        "sdk ladder",
    ),
)


def job_file(mix: Mix, work: Path) -> Path:
    """The job the mix runs: the example job, or the example job running the SDK example loop."""
    job = yaml.safe_load(DEFAULT_JOB.read_text())
    spec = job["spec"]
    spec.setdefault("local", {})["spares"] = mix.spares
    if mix.workload == "sdk":
        spec["workload"] = {
            **spec["workload"],
            "command": [sys.executable, str(REPO / "examples" / "sdk_loop.py")],
            "args": [],
            "standby": False,
        }
        spec["checkpoint"] = {**spec["checkpoint"], "interval": 5, "persistent": None}
    path = work / f"{mix.name.replace(' ', '-')}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def replayed(job: Path, report: Path, mix: Mix, costs_from: Path | None) -> dict[str, Any]:
    argv = [*slicekeeper_command(), "simulate", str(job), "--replay", str(report), "--json"]
    argv += ["--spares", str(mix.spares)] + (["--policy", mix.policy] if mix.policy else [])
    argv += ["--costs-from", str(costs_from)] if costs_from else []
    result = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=REPO)
    figures: dict[str, Any] = json.loads(result.stdout)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["jax", "sdk"], help="only the runs of this workload")
    parser.add_argument("--work", type=Path, help="keep the runs here (default: a temporary directory)")
    parser.add_argument(
        "--replay-only", action="store_true", help="replay the reports already in --work, run nothing"
    )
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="slicekeeper-validation-"))
    work.mkdir(parents=True, exist_ok=True)
    mixes = [m for m in MIXES if args.only in (None, m.workload)]
    jobs, reports = {}, {}
    for mix in mixes:
        jobs[mix.name] = job_file(mix, work)
        reports[mix.name] = work / f"{mix.name.replace(' ', '-')}.json"
        if args.replay_only:
            if not reports[mix.name].is_file():
                say(f"no report of {mix.name} in {work}: run without --replay-only first")
                return 1
            continue
        say(f"run {mix.name}: {mix.chaos}")
        command = [*slicekeeper_command(), "run", str(jobs[mix.name]), "--steps", str(mix.steps)]
        command += ["--chaos", mix.chaos, "--report", str(reports[mix.name])]
        command += ["--policy", mix.policy] if mix.policy else []
        status, _, timed_out = run_once(command, work / f"{mix.name.replace(' ', '-')}.log", 600, "    ")
        if status != 0 or timed_out:
            say(f"  {mix.name} failed (exit {status}); see {work}")
            return 1
    print(
        f"{'run':<14} {'faults':>6} {'measured':>9} {'predicted':>10} {'error':>7} "
        f"{'other costs':>12} {'error':>7}"
    )
    worst = 0.0
    for mix in mixes:
        own = replayed(jobs[mix.name], reports[mix.name], mix, None)
        other = replayed(jobs[mix.name], reports[mix.name], mix, reports.get(mix.costs_from))
        errors = (float(own["error"]), float(other["error"]))
        worst = max(worst, *(abs(e) for e in errors))
        print(
            f"{mix.name:<14} {own['faults']:>6} {own['measured']['goodput']:>9.4f} "
            f"{own['predicted']['goodput']:>10.4f} {errors[0]:>+7.4f} "
            f"{other['predicted']['goodput']:>12.4f} {errors[1]:>+7.4f}"
            + (f"  (costs of {mix.costs_from})" if mix.costs_from in reports else "  (own costs)"),
            flush=True,
        )
    print(f"largest error: {worst:.4f} (bar: {TOLERANCE}); runs kept in {work}")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
