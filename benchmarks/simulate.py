"""How fast the fleet simulator projects a job, and what it projects at 4k, 16k and 100k chips.

For each size it runs `slicekeeper simulate`'s projection (the product with its priced ladder, the
plain ladder, both with no spares, and the restart-from-persistent baseline on one failure schedule)
of the example job scaled to that many chips, and prints the wall time, the peak memory and the
goodputs. The timing target: 100,000 chips for 30 simulated days in at most 60 s (the policy engine
called at every decision).

    python -m benchmarks.simulate                          # 4k, 16k, 100k chips; 54 days, llama3
    python -m benchmarks.simulate --chips 100000 --days 30 # the timing target alone
    python -m benchmarks.simulate --budget 100             # the ladder's budgets at 100 an hour

Figures and the command are in docs/simulator.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

from slicekeeper.supervisor.fleet.costs import CostModel
from slicekeeper.supervisor.fleet.failures import failure_model
from slicekeeper.supervisor.fleet.projection import project, scenario

from benchmarks.harness import DEFAULT_JOB
from slicekeeper.api import TrainingJob, load_training_job
from slicekeeper.api_spec import PolicyBudgets, ReplaceBudget, RestartBudget, ScaleDownBudget


def with_budget(job: TrainingJob, per_hour: int | None) -> TrainingJob:
    """The job with its ladder's replace and scale-down budgets at `per_hour`, restarts at twice that."""
    if per_hour is None:
        return job
    budgets = PolicyBudgets(
        restart=RestartBudget(max=2 * per_hour),
        replace=ReplaceBudget(max=per_hour),
        scale_down=ScaleDownBudget(max=per_hour),
    )
    policy = job.spec.policy.model_copy(update={"budgets": budgets})
    return job.model_copy(update={"spec": job.spec.model_copy(update={"policy": policy})})


COLUMNS = ("plain ladder", "no spares", "no spares, plain ladder", "restart from persistent")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chips", type=int, action="append", help="sizes (default 4096, 16384, 100000)")
    parser.add_argument("--days", type=float, default=54.0, help="simulated days (default 54)")
    parser.add_argument("--failures", default="llama3", help="failure model (default llama3)")
    parser.add_argument("--step-seconds", type=float, default=10.0, help="step time (default 10)")
    parser.add_argument("--budget", type=int, help="the ladder's replace and scale-down uses an hour")
    args = parser.parse_args(argv)
    job = with_budget(load_training_job(DEFAULT_JOB), args.budget)
    print(
        f"{'chips':>8} {'days':>5} {'failures':>9} {'goodput':>8} {'plain':>8} {'no spares':>9} "
        f"{'no sp. plain':>12} {'persistent':>10} {'wall (s)':>9} {'peak RSS (MiB)':>14}"
    )
    for chips in args.chips or [4096, 16384, 100_000]:
        started = time.perf_counter()
        figures = project(
            scenario(
                job,
                chips=chips,
                slices=None,
                days=args.days,
                failures=failure_model(args.failures),
                costs=CostModel(step_seconds=args.step_seconds),
                spares=None,
                seed=0,
                max_restarts=None,
            )
        )
        wall = time.perf_counter() - started
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        base = [figures["baselines"][name] for name in COLUMNS]
        print(
            f"{figures['chips']:>8} {args.days:>5g} {figures['failure_count']:>9} {figures['goodput']:>8.4f} "
            f"{base[0]:>8.4f} {base[1]:>9.4f} {base[2]:>12.4f} {base[3]:>10.4f} {wall:>9.1f} {rss:>14.0f}",
            flush=True,
        )
        print(
            json.dumps(
                {k: figures[k] for k in ("chips", "goodput", "baselines", "decisions", "failure_reason")}
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
