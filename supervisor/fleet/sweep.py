"""`slicekeeper simulate JOB --sweep checkpoint.interval=5,10,20,spares=0,64`: the same failures, every
combination of settings, the goodput of each, the best one, and the textbook optimum interval beside it.

What can be swept: `checkpoint.interval` (steps between local saves), `spares`, and any cost model
field as `cost.NAME` (e.g. `cost.replacement_seconds`, what a faster node pool would buy). Each
combination runs the product's simulation (the real state machine and policy) on one failure schedule,
so the rows differ only by their settings.

The optimum checkpoint interval for the blocking save C and the job's mean time between failures M:
Young (1974) T = sqrt(2 C M); Daly (2006) T = sqrt(2 C M) (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C
for C < 2M, else M. Both ignore what a failure costs besides the lost steps; the sweep does not.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys
import time
from typing import Any

from slicekeeper.supervisor.fleet.costs import CostModel, setting_names, with_settings
from slicekeeper.supervisor.fleet.failures import schedule
from slicekeeper.supervisor.fleet.projection import Scenario, job_of
from slicekeeper.supervisor.fleet.simulation import Simulation, young_interval_steps

from slicekeeper.errors import UserError
from slicekeeper.policy.engine import PolicyEngine

SETTINGS = ("checkpoint.interval", "spares")
"""What can be swept besides the cost model's fields (`cost.NAME`)."""


def parse(specs: list[str]) -> dict[str, list[float]]:
    """`NAME=V1,V2,NAME2=V3,...` (repeatable) as name -> values; UserError naming what is wrong."""
    swept: dict[str, list[float]] = {}
    cost_fields = set(setting_names())
    for spec in specs:
        name: str | None = None
        for token in spec.split(","):
            token = token.strip()
            if "=" in token:
                name, _, token = token.partition("=")
                cost = name.startswith("cost.") and name.removeprefix("cost.") in cost_fields
                if name not in SETTINGS and not cost:
                    raise UserError(
                        f"--sweep {spec!r}: '{name}' is not one of {', '.join(SETTINGS)} or cost.NAME "
                        f"(NAME a cost model field: {', '.join(sorted(cost_fields))})"
                    )
                if name in swept:
                    raise UserError(f"--sweep: '{name}' is given twice")
                swept[name] = []
            if name is None:
                raise UserError(f"--sweep {spec!r}: expected NAME=VALUE[,VALUE...]")
            try:
                value = float(token)
            except ValueError:
                raise UserError(f"--sweep {spec!r}: {token!r} is not a number (for {name})") from None
            if value < 0 or (name == "checkpoint.interval" and value < 1):
                raise UserError(f"--sweep {spec!r}: {name} cannot be {token}")
            swept[name].append(value)
    return swept


def optimum_steps(costs: CostModel, failures_per_second: float) -> dict[str, float]:
    """Young's and Daly's optimum interval, in steps, for the blocking save and the failure rate."""
    if failures_per_second <= 0:
        return {"young": math.inf, "daly": math.inf}
    save, mtbf = costs.snapshot(), 1 / failures_per_second
    if save >= 2 * mtbf:
        daly = mtbf
    else:
        ratio = save / (2 * mtbf)
        daly = math.sqrt(2 * save * mtbf) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - save
    return {"young": young_interval_steps(costs, failures_per_second), "daly": daly / costs.step_seconds}


def sweep(s: Scenario, swept: dict[str, list[float]], *, progress: bool = True) -> dict[str, Any]:
    """Every combination of the swept settings on one failure schedule; the rows and the best."""
    started = time.perf_counter()
    names = list(swept)
    seconds = s.days * 86_400
    base = job_of(s, s.spares)
    failures = schedule(
        s.failures, chips=base.chips, host_count=base.shape.host_count, seconds=seconds, seed=s.seed
    )
    combinations = list(itertools.product(*(swept[n] for n in names)))
    rows: list[dict[str, Any]] = []
    for index, values in enumerate(combinations, start=1):
        setting = dict(zip(names, values, strict=True))
        job = job_of(s, int(setting.get("spares", s.spares)))
        if "checkpoint.interval" in setting:
            job = dataclasses.replace(job, interval=int(setting["checkpoint.interval"]))
        costs = with_settings(
            s.costs, [f"{n.removeprefix('cost.')}={v}" for n, v in setting.items() if n.startswith("cost.")]
        )
        engine = PolicyEngine.from_spec(s.training_job.spec.policy)
        result = Simulation(job, costs, engine).run(failures, seconds)
        rows.append(
            {
                "setting": {n: _number(v) for n, v in setting.items()},
                "goodput": round(result.goodput, 4),
                "wasted_progress_hours": round(result.badput_seconds().get("wasted_progress", 0.0) / 3600, 2),
                "checkpoint_save_hours": round(result.badput_seconds().get("checkpoint_save", 0.0) / 3600, 2),
                "failure_reason": result.failure_reason,
            }
        )
        if progress:
            print(
                f"  [{index}/{len(combinations)}] {_label(rows[-1]['setting'])}: "
                f"goodput {rows[-1]['goodput']:.4f}",
                file=sys.stderr,
                flush=True,
            )
    rate = s.failures.per_chip_day * base.chips / 86_400
    return {
        "job": s.training_job.metadata.name,
        "chips": base.chips,
        "days": s.days,
        "failures": s.failures.name,
        "failure_count": len(failures),
        "step_seconds": s.costs.step_seconds,
        "rows": rows,
        "best": max(rows, key=lambda r: r["goodput"]),
        "optimum_interval_steps": {k: round(v, 1) for k, v in optimum_steps(s.costs, rate).items()},
        "wall_seconds": round(time.perf_counter() - started, 2),
    }


def _number(value: float) -> float | int:
    return int(value) if value.is_integer() else value


def _label(setting: dict[str, Any]) -> str:
    return ", ".join(f"{n}={v}" for n, v in setting.items())


def sweep_table(figures: dict[str, Any]) -> str:
    names = list(figures["rows"][0]["setting"]) if figures["rows"] else []
    lines = [
        f"{figures['job']}: {figures['chips']:,} chips, {figures['days']:g} days, "
        f"{figures['step_seconds']:g} s steps, failures {figures['failures']}: "
        f"{figures['failure_count']:,} in all",
        "",
        "  " + "".join(f"{n:>24}" for n in names) + f"{'goodput':>10}{'wasted (h)':>12}{'saving (h)':>12}",
    ]
    for row in figures["rows"]:
        mark = "  <- best" if row == figures["best"] else ""
        lines.append(
            "  "
            + "".join(f"{row['setting'][n]:>24}" for n in names)
            + f"{row['goodput']:>10.4f}{row['wasted_progress_hours']:>12.2f}"
            + f"{row['checkpoint_save_hours']:>12.2f}"
            + (f"  (failed: {row['failure_reason']})" if row["failure_reason"] else "")
            + mark
        )
    optimum = figures["optimum_interval_steps"]
    lines += [
        "",
        f"  best: {_label(figures['best']['setting'])} (goodput {figures['best']['goodput']:.4f})",
        f"  optimum checkpoint interval for this failure rate: Young {optimum['young']:g} steps, "
        f"Daly {optimum['daly']:g} steps",
        f"  simulated in {figures['wall_seconds']:g} s",
    ]
    return "\n".join(lines)
