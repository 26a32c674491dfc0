"""`slicekeeper simulate`: the job at its real size, the same failures for the product and for the
baselines, and the table (or one JSON object) that compares them.

Five runs on one failure schedule: slicekeeper as the job's spec configures it (its spares, its
policy, told what each remedy costs: context.expected_cost), the same with the plain ladder (no
costs), both again with no spares, and the restart-from-persistent baseline (every pod recreated and
every host restored from the persistent tier at each failure: what most jobs do today). Young's
optimum checkpoint interval for the model's failure rate is printed beside the job's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slicekeeper.supervisor.fleet.costs import CostModel
from slicekeeper.supervisor.fleet.failures import FailureModel, schedule
from slicekeeper.supervisor.fleet.outcome import Job, Mode, Result
from slicekeeper.supervisor.fleet.simulation import Simulation, young_interval_steps
from slicekeeper.supervisor.leader.restart_rule import RestartRule

from slicekeeper.api import TrainingJob
from slicekeeper.errors import UserError
from slicekeeper.policy.engine import PolicyEngine
from slicekeeper.shape import JobShape

WIDTH = 25
"""A run's column in the table (its name is at most 23 characters)."""
NO_CAP = 10**9
"""A simulated job's restart cap unless `--max-restarts` gives one: spec.health.maxRestarts is a
local run's guard; a job of weeks bounds its remedies by the policy's budgets per window."""


@dataclass(frozen=True)
class Scenario:
    training_job: TrainingJob
    slices: int
    days: float
    failures: FailureModel
    costs: CostModel
    spares: int
    seed: int = 0
    max_restarts: int = NO_CAP


def scenario(
    training_job: TrainingJob,
    *,
    chips: int | None,
    slices: int | None,
    days: float,
    failures: FailureModel,
    costs: CostModel,
    spares: int | None,
    seed: int,
    max_restarts: int | None,
) -> Scenario:
    """The job scaled to `chips` (whole slices, rounded up) or `slices`; UserError for a size of nothing."""
    slice_chips = training_job.slice_shape.chips
    if chips is not None and slices is not None:
        raise UserError("--chips and --slices: give one of them")
    count = math.ceil(chips / slice_chips) if chips is not None else (slices or training_job.spec.slices)
    if count < 1 or days <= 0:
        raise UserError("--chips/--slices must be at least one slice, and --days more than 0")
    hosts = count * training_job.slice_shape.host_count
    default_spares = max(1, hosts // 64)  # about 1.5 % of the hosts (assumption, docs/simulator.md)
    return Scenario(
        training_job,
        count,
        days,
        failures,
        costs,
        default_spares if spares is None else spares,
        seed,
        NO_CAP if max_restarts is None else max_restarts,
    )


def job_of(s: Scenario, spares: int) -> Job:
    """The scenario's job as the simulator runs it, with `spares`."""
    spec = s.training_job.spec
    shape = s.training_job.slice_shape
    persistent = (
        spec.checkpoint.persistent.interval if spec.checkpoint.persistent else spec.checkpoint.interval
    )
    return Job(
        shape=JobShape(s.slices, shape.host_count, shape.chips_per_host),
        min_slices=min(spec.min_slices, s.slices),
        interval=spec.checkpoint.interval,
        persistent_interval=persistent,
        spares=spares,
        rule=RestartRule(s.max_restarts, spec.health.max_restarts_without_progress),
    )


def project(s: Scenario, report: Path | None = None) -> dict[str, Any]:
    """Run the product and both baselines on the same failures; the figures as one JSON object.
    `report`: the product's run is also written there as a run's report, with its policy event log
    and page beside it (supervisor.fleet.report_file)."""
    started = time.perf_counter()
    job = job_of(s, s.spares)
    seconds = s.days * 86_400
    failures = schedule(
        s.failures, chips=job.chips, host_count=job.shape.host_count, seconds=seconds, seed=s.seed
    )
    engine = PolicyEngine.from_spec(s.training_job.spec.policy)
    product = Simulation(job, s.costs, engine, keep_records=report is not None).run(failures, seconds)
    no_spares = Simulation(
        job_of(s, 0), s.costs, PolicyEngine.from_spec(s.training_job.spec.policy), name="no spares"
    ).run(failures, seconds)
    plain = Simulation(
        job, s.costs, PolicyEngine.from_spec(s.training_job.spec.policy), name="plain ladder", priced=False
    ).run(failures, seconds)
    plain_no_spares = Simulation(
        job_of(s, 0),
        s.costs,
        PolicyEngine.from_spec(s.training_job.spec.policy),
        name="no spares, plain ladder",
        priced=False,
    ).run(failures, seconds)
    baseline = Simulation(
        job, s.costs, None, mode=Mode.PERSISTENT_RESTART, name="restart from persistent"
    ).run(failures, seconds)
    rate = s.failures.per_chip_day * job.chips / 86_400
    figures = {
        "job": s.training_job.metadata.name,
        "chips": job.chips,
        "hosts": job.shape.host_count,
        "slices": s.slices,
        "days": s.days,
        "failures": s.failures.name,
        "failure_count": len(failures),
        "step_seconds": s.costs.step_seconds,
        "spares": s.spares,
        "checkpoint_interval_steps": job.interval,
        "young_interval_steps": round(young_interval_steps(s.costs, rate), 1),
        "goodput": round(product.goodput, 4),
        "baselines": {r.name: round(r.goodput, 4) for r in (baseline, no_spares, plain, plain_no_spares)},
        "badput_seconds": product.badput_seconds(),
        "decisions": dict(sorted(product.decisions.items())),
        "mean_recovery_seconds": product.mean_recovery(),
        "failure_reason": product.failure_reason,
        "runs": {r.name: _figures(r) for r in (product, plain, no_spares, plain_no_spares, baseline)},
        "wall_seconds": round(time.perf_counter() - started, 2),
    }
    if report is not None:
        figures["report"] = _write_report(s, product, figures, report)
    return figures


def _write_report(s: Scenario, product: Result, figures: dict[str, Any], path: Path) -> dict[str, str]:
    """The product's run as a report file, its policy event log and its page; their paths."""
    from slicekeeper.supervisor.fleet import report_file

    from slicekeeper.report_page import write_page

    simulated = {k: v for k, v in figures.items() if k not in ("runs", "wall_seconds")}
    report = report_file.simulated_report(
        product, job=s.training_job.metadata.name, step_seconds=s.costs.step_seconds, simulated=simulated
    )
    written, events = report_file.write(report, product, path)
    try:
        page = write_page({**report, "events_log": str(events)}, written)
    except OSError as error:
        raise UserError(f"--report {path}: cannot write the page: {error}") from None
    return {"report": str(written), "events_log": str(events), "page": str(page)}


def _figures(result: Result) -> dict[str, Any]:
    return {
        "goodput": round(result.goodput, 4),
        "badput_seconds": result.badput_seconds(),
        "decisions": dict(sorted(result.decisions.items())),
        "mean_recovery_seconds": result.mean_recovery(),
        "failure_reason": result.failure_reason,
    }


def table(figures: dict[str, Any]) -> str:
    """The comparison as text: each run's goodput and badput, the decisions, the interval."""
    runs = figures["runs"]
    lines = [
        f"{figures['job']}: {figures['chips']:,} chips "
        f"({figures['hosts']:,} hosts, {figures['slices']} slices), "
        f"{figures['days']:g} days, {figures['step_seconds']:g} s steps, failures {figures['failures']}: "
        f"{figures['failure_count']:,} in all",
        "",
        f"  {'':<26}" + "".join(f"{name:>{WIDTH}}" for name in runs),
        f"  {'goodput':<26}" + "".join(f"{r['goodput']:>{WIDTH}.4f}" for r in runs.values()),
    ]
    categories = sorted({c for r in runs.values() for c in r["badput_seconds"]})
    for category in categories:
        lines.append(
            f"  {category + ' (h)':<26}"
            + "".join(f"{r['badput_seconds'].get(category, 0.0) / 3600:>{WIDTH}.1f}" for r in runs.values())
        )
    decisions = ", ".join(f"{k} {v}" for k, v in figures["decisions"].items()) or "none"
    recovery = ", ".join(f"{k} {v:g} s" for k, v in figures["mean_recovery_seconds"].items()) or "none"
    lines += [
        "",
        f"  decisions (slicekeeper): {decisions}",
        f"  mean time to training again: {recovery}",
        f"  checkpoint interval: {figures['checkpoint_interval_steps']} steps; Young's optimum for this "
        f"failure rate: {figures['young_interval_steps']:g} steps",
        f"  spares: {figures['spares']}; simulated in {figures['wall_seconds']:g} s",
    ]
    if figures["failure_reason"]:
        lines.append(f"  the job failed: {figures['failure_reason']}")
    if "report" in figures:
        lines += [f"  {name.replace('_', ' ')}: {where}" for name, where in figures["report"].items()]
    return "\n".join(lines)
