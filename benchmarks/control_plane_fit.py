"""The simulator's control-plane costs as lines in the job's size, fitted to a control-plane run.

`slicekeeper simulate` prices a restart round and a leader's hand-over at any size
(supervisor.fleet.costs: `restart_round_*`, `handover_*`) from what the control-plane benchmark
measured at a few sizes. This fits those lines to a benchmark run's JSON lines, prints them as
`--cost` settings, and compares them with the cost model's defaults: it exits 1, naming the cost,
when a default is more than TOLERANCE (and SLACK_SECONDS) off the run at a size measured, so that
the defaults are refitted (and docs/simulator.md with them) when the control plane's cost changes.

    .venv/bin/python -m benchmarks.control_plane_scale --hosts 1000 --hosts 5000 --hosts 10000 \\
        --runs 1 --rounds 3 | tee control-plane.txt
    .venv/bin/python -m benchmarks.control_plane_fit control-plane.txt
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from slicekeeper.supervisor.fleet.costs import CostModel, SizeCurve, fit_size_curve

from slicekeeper.errors import UserError

TOLERANCE = 0.25
"""How far (relative) a default may be from the run's figure at a size measured: run-to-run spread
on this machine is about 10-15 % (docs/benchmarks.md)..."""
SLACK_SECONDS = 0.5
"""...or this far in seconds, whichever is more: at the smallest size a line through the origin
may be half a second off a figure of half a second."""
COSTS = {
    "restart_round": ("restart_round_s", "restart_round_base_seconds", "restart_round_per_host_seconds"),
    "handover": ("handover_rejoin_s", "handover_base_seconds", "handover_per_host_seconds"),
}
"""Each cost: the benchmark's field, and the cost model's base and per-host fields."""


def benchmark_lines(text: str, source: str) -> list[dict[str, Any]]:
    """The JSON lines of a control_plane_scale run (its table and other lines are skipped)."""
    lines = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise SystemExit(f"{source}:{number}: not a JSON line: {error}") from None
    if not lines:
        raise SystemExit(f"{source}: no JSON line of benchmarks.control_plane_scale in it")
    return lines


def fitted(lines: list[dict[str, Any]]) -> dict[str, SizeCurve]:
    curves = {}
    for cost, (field, _, _) in COSTS.items():
        points = [(int(line["hosts"]), float(line[field])) for line in lines if field in line]
        try:
            curves[cost] = fit_size_curve(points)
        except UserError as error:
            raise SystemExit(f"{field}: {error}") from None
    return curves


def misses(lines: list[dict[str, Any]], model: CostModel) -> list[str]:
    """Each cost whose default is more than TOLERANCE off a size's figure, said with both."""
    found = []
    for cost, (field, _, _) in COSTS.items():
        line_of_cost: SizeCurve = getattr(model, cost)
        for line in lines:
            if field not in line:
                continue
            measured, default = float(line[field]), line_of_cost.at(int(line["hosts"]))
            if abs(default - measured) > max(TOLERANCE * measured, SLACK_SECONDS):
                found.append(
                    f"{cost} at {line['hosts']:,} hosts: the default prices {default:.2f} s, the run "
                    f"measured {measured:.2f} s (more than {TOLERANCE:.0%} and {SLACK_SECONDS} s off)"
                )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the output of benchmarks.control_plane_scale")
    args = parser.parse_args(argv)
    try:
        text = args.run.read_text()
    except OSError as error:
        raise SystemExit(f"{args.run}: {error.strerror}") from None
    lines = benchmark_lines(text, str(args.run))
    for cost, curve in fitted(lines).items():
        _, base, per_host = COSTS[cost]
        print(f"{cost}: {curve.base_seconds:.3f} s + {curve.per_host_seconds * 1e3:.4f} ms a host")
        print(f"  --cost {base}={curve.base_seconds:.4g} --cost {per_host}={curve.per_host_seconds:.4g}")
    missed = misses(lines, CostModel())
    for miss in missed:
        print(f"MISSED: {miss}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
