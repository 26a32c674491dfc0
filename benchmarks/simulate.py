"""How fast the fleet simulator projects a job, and what it projects at 4k, 16k and 100k chips.

For each size it runs `slicekeeper simulate`'s projection (the product, no spares, and the
restart-from-persistent baseline on one failure schedule) of the example job scaled to that many
chips, and prints the wall time, the peak memory and the goodputs. The timing target: 100,000 chips
for 30 simulated days in at most 60 s (the policy engine called at every decision).

    python -m benchmarks.simulate                          # 4k, 16k, 100k chips; 54 days, llama3
    python -m benchmarks.simulate --chips 100000 --days 30 # the timing target alone

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
from slicekeeper.api import load_training_job


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chips", type=int, action="append", help="sizes (default 4096, 16384, 100000)")
    parser.add_argument("--days", type=float, default=54.0, help="simulated days (default 54)")
    parser.add_argument("--failures", default="llama3", help="failure model (default llama3)")
    parser.add_argument("--step-seconds", type=float, default=10.0, help="step time (default 10)")
    args = parser.parse_args(argv)
    job = load_training_job(DEFAULT_JOB)
    print(
        f"{'chips':>8} {'days':>5} {'failures':>9} {'goodput':>8} {'persistent':>10} {'no spares':>9} "
        f"{'wall (s)':>9} {'peak RSS (MiB)':>14}"
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
        base = figures["baselines"]
        print(
            f"{figures['chips']:>8} {args.days:>5g} {figures['failure_count']:>9} {figures['goodput']:>8.4f} "
            f"{base['restart from persistent']:>10.4f} {base['no spares']:>9.4f} {wall:>9.1f} {rss:>14.0f}",
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
