"""`slicekeeper simulate JOB.yaml --replay REPORT.json`: a recorded run through the simulator, the
predicted goodput beside the measured one.

What a replay takes from the run (its report, and the hosts' event logs in its run directory): the hosts
and slices, the faults and the steps they came at, the spares that joined, the step time (productive
seconds per step kept), the run's own start (launch to the first step, by category) and end (the last
step to the report), and the costs of its recoveries: detection per fault kind, the stop-and-start
round, the workload's distributed init, prep, restore (local and peer) and program load, the blocking
part of a save. `--costs-from OTHER.json` takes every recovery cost from another run instead: the
prediction then uses nothing this run measured about its recoveries, which is the test of the cost
model.

What it predicts: the steps trained again after each fault (from the checkpoint interval and where the
fault came), the policy's decisions (the real engine and the user's policy) and the world they leave,
every restart through the real state machine, hence the wall time to the run's last step and its
goodput. A fault the simulator does not model (a slowed host: stragglers are not simulated) is left
out and named.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slicekeeper.supervisor.fleet.costs import CostModel, SizeCurve
from slicekeeper.supervisor.fleet.failures import Category, Effect, Failure
from slicekeeper.supervisor.fleet.outcome import Job
from slicekeeper.supervisor.fleet.simulation import Simulation
from slicekeeper.supervisor.leader.restart_rule import RestartRule

from slicekeeper.api import TrainingJob
from slicekeeper.errors import UserError
from slicekeeper.goodput import Category as Badput
from slicekeeper.policy.engine import PolicyEngine
from slicekeeper.report_timeline import HostTimeline, read_timelines
from slicekeeper.shape import JobShape

EFFECTS = {
    "crash": Effect.CRASH,
    "hang": Effect.HANG,
    "host_lost": Effect.HOST_LOST,
    "announced_loss": Effect.MAINTENANCE,
    "checkpoint_invalid": Effect.CORRUPT,
    "nonfinite_loss": Effect.CORRUPT,
}
"""What the run detected a fault as -> the simulator's effect."""
CAPACITY = "spare"
"""The chaos kind of a spare joining: capacity comes back."""
NEVER = 1e12
"""A local run makes no new machine: only its spares stand in."""


@dataclass(frozen=True)
class Measured:
    """What a run's report and event log say about its costs."""

    step_seconds: float
    """The full world's step time."""
    world_step_seconds: dict[int, float]
    """Slices training -> the step time of that world (on one machine fewer hosts share its cores)."""
    start: dict[str, float]
    """The run's first start, launch to its first step, by goodput category (mean over hosts)."""
    end_seconds: float
    """The last step to the end of the run."""
    detection: dict[str, float]
    """Fault kind -> mean seconds from the fault to its detection."""
    parts: dict[str, float]
    """A recovery's parts (slicekeeper.recovery_breakdown), mean over the hosts that restarted."""
    restore_peer: float | None
    """A hot-swapped host's restore (from a peer), where the run had one."""
    save_seconds: float
    """The blocking part of one save."""


def read_report(path: Path) -> dict[str, Any]:
    import json

    try:
        report: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise UserError(f"--replay {path}: not a readable report: {error}") from None
    for key in ("wall_seconds", "steps_completed", "productive_seconds", "faults", "hosts"):
        if key not in report:
            raise UserError(f"--replay {path}: no '{key}': not a report of `slicekeeper run`")
    return report


def _timelines(report: dict[str, Any], path: Path) -> dict[int, HostTimeline]:
    """Each host's steps, from the event logs in the run's directory (`run_dir`)."""
    run_dir = report.get("run_dir")
    if not run_dir or not Path(run_dir).is_dir():
        raise UserError(
            f"--replay {path}: its run directory ({run_dir or 'run_dir'}) is missing: a replay needs "
            "each host's event log there (`slicekeeper run --work-dir DIR` keeps it where you choose)"
        )
    timelines = {h: t for h, t in read_timelines(report).items() if t.steps}
    if not timelines:
        raise UserError(f"--replay {path}: the event logs in {run_dir} hold no step of any host")
    return timelines


def measure(report: dict[str, Any], path: Path, *, interval: int) -> Measured:
    """The run's step time, start, end and recovery costs (`interval`: the job's steps between saves)."""
    steps = int(report["steps_completed"])
    if steps <= 0 or report["productive_seconds"] <= 0:
        raise UserError(f"--replay {path}: the run completed no step")
    timelines = _timelines(report, path)
    by_world = world_step_seconds(report, timelines)
    step_seconds = by_world.get(max(by_world, default=0), 0.0) or (
        max(float(h["productive_seconds"]) for h in report["hosts"]) / steps
    )
    start: defaultdict[str, float] = defaultdict(float)
    ends = []
    for timeline in timelines.values():
        first = min(t for t, _ in timeline.steps) - step_seconds
        booked = 0.0
        for begin, end, category in timeline.intervals:
            if begin < first and category != Badput.PRODUCTIVE:
                start[category] += (min(end, first) - begin) / len(timelines)
                booked += min(end, first) - begin
        start[Badput.OTHER] += max(0.0, first - booked) / len(timelines)
        if max(step for _, step in timeline.steps) >= steps:  # a host that trained to the end
            ends.append(max(t for t, _ in timeline.steps))
    detection: defaultdict[str, list[float]] = defaultdict(list)
    parts: defaultdict[str, list[float]] = defaultdict(list)
    swapped = {(s["host"], s["generation"] + 1) for s in report.get("hot_swaps", {}).get("details", [])}
    peer: list[float] = []
    for fault in report["faults"]:
        if fault.get("detected_as") and fault.get("detection_seconds") is not None:
            detection[_detected_as(fault, report)].append(float(fault["detection_seconds"]))
        hosts = [h for h in (fault.get("breakdown") or {}).get("hosts", []) if "total" in h]
        if not hosts:
            continue
        generation = min(h["generation"] for h in hosts)  # a dropped slice's hosts: its scale-up
        for host in (h for h in hosts if h["generation"] == generation):
            parts["round"].append(host.get("stop", 0.0) + host.get("launch", 0.0) + host.get("other", 0.0))
            for part in ("distributed_init", "prep", "restore"):
                parts[part].append(host.get(part, 0.0))
            parts["programs"].append(max(0.0, host.get("programs", 0.0) + host["first_step"] - step_seconds))
            if (host["host"], generation) in swapped:
                peer.append(host.get("restore", 0.0))
    saves = max(1, steps // interval)
    return Measured(
        step_seconds=step_seconds,
        world_step_seconds=by_world,
        start=dict(start),
        end_seconds=max(0.0, float(report["wall_seconds"]) - statistics.fmean(ends)) if ends else 0.0,
        detection={kind: statistics.fmean(seconds) for kind, seconds in detection.items()},
        parts={part: statistics.fmean(values) for part, values in parts.items()},
        restore_peer=statistics.fmean(peer) if peer else None,
        save_seconds=float(report["badput_seconds"].get(Badput.CHECKPOINT_SAVE, 0.0)) / saves,
    )


def _detected_as(fault: dict[str, Any], report: dict[str, Any]) -> str:
    """What the fault was detected as; `leader_lost` for a lost host that held the lead (the others
    waited for its lease)."""
    kind = str(fault["detected_as"])
    if kind == "host_lost" and fault.get("detected_at") is not None:
        for change in report.get("leader_changes", []):
            if change.get("from_host") == fault["host"] and abs(change["at"] - fault["detected_at"]) < 1.0:
                return "leader_lost"
    return kind


def world_step_seconds(report: dict[str, Any], timelines: dict[int, HostTimeline]) -> dict[int, float]:
    """Each world's step time (by the number of slices training): the mean time between consecutive
    steps while it trained (gaps over three times the median left out: saves, restarts), scaled so
    that the steps kept add up to the productive seconds of the host that took part in every world."""
    worlds = report.get("world") or []
    if not worlds:
        return {}
    bounds = [float(w["t"]) for w in worlds] + [float(report["wall_seconds"])]
    ends = [int(w["step"]) for w in worlds[1:]] + [int(report["steps_completed"])]
    gaps: defaultdict[int, list[float]] = defaultdict(list)
    kept: defaultdict[int, int] = defaultdict(int)
    for index, world in enumerate(worlds):
        slices = len(world["slices"])
        kept[slices] += max(0, ends[index] - int(world["step"]))
        for timeline in timelines.values():
            points = sorted(timeline.steps)
            gaps[slices] += [
                t1 - t0
                for (t0, s0), (t1, s1) in itertools.pairwise(points)
                if s1 == s0 + 1 and bounds[index] <= t0 and t1 < bounds[index + 1]
            ]
    means = {}
    for slices, found in gaps.items():
        if found:
            limit = 3 * statistics.median(found)
            means[slices] = statistics.fmean(g for g in found if g < limit)
    if not means:
        return {}
    full = means[max(means)]
    means = {slices: means.get(slices, full) for slices in kept}
    productive = max(float(h["productive_seconds"]) for h in report["hosts"])
    scale = productive / max(1e-9, sum(kept[s] * means[s] for s in kept))
    return {slices: mean * scale for slices, mean in means.items()}


def cost_model(measured: Measured, *, step_seconds: float, defaults: CostModel) -> CostModel:
    """A cost model of the measured recoveries (shard_gb 1: the rates are 1 / the seconds); a fault
    kind the run never detected keeps `defaults`' detection (the job's spec: its hang timeout)."""
    parts, detection = measured.parts, measured.detection

    def rate(seconds: float | None) -> float:
        return 1.0 / max(seconds or 0.0, 1e-6)

    return CostModel(
        step_seconds=step_seconds,
        shard_gb=1.0,
        crash_detect_seconds=detection.get("crash", defaults.crash_detect_seconds),
        hang_floor_seconds=detection.get("hang", defaults.hang_floor_seconds),
        hang_factor=0.0 if "hang" in detection else defaults.hang_factor,
        lost_detect_seconds=detection.get("host_lost", defaults.lost_detect_seconds),
        leader_lost_detect_seconds=detection.get("leader_lost", defaults.leader_lost_detect_seconds),
        restart_round=SizeCurve(parts.get("round", 0.0), 0.0),
        handover=SizeCurve(0.0, 0.0),  # a run's leader-lost detection holds its hosts' registering again
        distributed_init_seconds=parts.get("distributed_init", 0.0),
        prep_seconds=parts.get("prep", 0.0),
        program_load_seconds=parts.get("programs", 0.0),
        program_compile_seconds=parts.get("programs", 0.0),
        local_gb_per_second=rate(parts.get("restore")),
        peer_gb_per_second=rate(
            measured.restore_peer if measured.restore_peer is not None else parts.get("restore")
        ),
        snapshot_gb_per_second=rate(measured.save_seconds),
        replacement_seconds=NEVER,
    )


def failures_of(report: dict[str, Any]) -> tuple[list[Failure], list[str]]:
    """The run's faults as the simulator's schedule (at their steps), and those it does not model."""
    found, skipped = [], []
    for fault in report["faults"]:
        kind, step = fault["kind"], fault.get("step")
        if kind == CAPACITY:
            effect: Effect | None = Effect.CAPACITY
        else:
            effect = EFFECTS.get(str(fault.get("detected_as")))
        if effect is None or not isinstance(step, int):
            skipped.append(
                f"{kind} on host {fault['host']} at step {step} (detected as {fault.get('detected_as')})"
            )
            continue
        category = Category(f"{kind} (replayed)", 0.0, effect)
        found.append(Failure(float(fault.get("fired_at") or 0.0), int(fault["host"]), category, step=step))
    return sorted(found, key=lambda f: (f.step or 0, f.t)), skipped


def replay(
    training_job: TrainingJob,
    report_path: Path,
    *,
    costs_from: Path | None = None,
    spares: int | None = None,
) -> dict[str, Any]:
    """The run predicted from its faults and measured costs; the figures beside the measured ones."""
    spec = training_job.spec
    interval = spec.checkpoint.interval
    report = read_report(report_path)
    measured = measure(report, report_path, interval=interval)
    source = measured
    if costs_from is not None:
        source = measure(read_report(costs_from), costs_from, interval=interval)
    health = spec.health
    defaults = CostModel(
        step_seconds=measured.step_seconds,
        hang_floor_seconds=health.hang_timeout_floor_seconds,
        hang_factor=health.hang_timeout_factor,
        lost_detect_seconds=0.05,  # locally a lost machine's connection closes at once
        crash_detect_seconds=0.05,
        leader_lost_detect_seconds=3.7,  # the local lease (3 s) and an election: docs/simulator.md
    )
    costs = cost_model(source, step_seconds=measured.step_seconds, defaults=defaults)
    host_slices = [int(h["slice"]) for h in report["hosts"]]
    slices = max(host_slices) + 1
    job = Job(
        shape=JobShape(slices, len(host_slices) // slices, training_job.slice_shape.chips_per_host),
        min_slices=min(spec.min_slices, slices),
        interval=spec.checkpoint.interval,
        persistent_interval=spec.checkpoint.interval,
        spares=spec.local.spares if spares is None else spares,
        rule=RestartRule(spec.health.max_restarts, spec.health.max_restarts_without_progress),
        new_machines=False,
    )
    failures, skipped = failures_of(report)
    steps = int(report["steps_completed"])
    simulation = Simulation(
        job,
        costs,
        PolicyEngine.from_spec(spec.policy),
        name="predicted",
        step_seconds_by_slices=measured.world_step_seconds,
        priced=False,  # a run's leader does not tell its policy what remedies cost (docs/policy.md)
    )
    predicted = simulation.run(
        failures,
        100 * float(report["wall_seconds"]) + 3600,
        start=measured.start,
        until_step=steps,
        end_seconds=measured.end_seconds,
    )
    real = Counter(
        d["action"]["name"] for d in report.get("decisions", []) if d["event"]["kind"] != "straggler"
    )
    return {
        "report": str(report_path),
        "costs_from": str(costs_from or report_path),
        "hosts": job.shape.host_count,
        "steps": steps,
        "step_seconds": round(measured.step_seconds, 4),
        "faults": len(failures),
        "not_simulated": skipped,
        "measured": {
            "goodput": float(report["goodput"]),
            "wall_seconds": float(report["wall_seconds"]),
            "badput_seconds": {k: round(float(v), 3) for k, v in report["badput_seconds"].items() if v},
            "decisions": dict(sorted(real.items())),
            "state": report.get("state"),
        },
        "predicted": {
            "goodput": round(predicted.goodput, 4),
            "wall_seconds": round(predicted.seconds, 3),
            "badput_seconds": {k: round(v, 3) for k, v in predicted.badput_seconds(digits=3).items()},
            "decisions": dict(sorted(predicted.decisions.items())),
            "state": "failed" if predicted.failure_reason else "succeeded",
            "steps": round(predicted.steps, 1),
        },
        "error": round(predicted.goodput - float(report["goodput"]), 4),
        "costs": {k: round(v, 4) for k, v in _costs_table(costs).items()},
    }


def _costs_table(costs: CostModel) -> dict[str, float]:
    return {
        "crash_detect_seconds": costs.crash_detect_seconds,
        "hang_detect_seconds": costs.hang_detect(),
        "lost_detect_seconds": costs.lost_detect_seconds,
        "restart_round_seconds": costs.restart_round.at(0),
        "distributed_init_seconds": costs.distributed_init_seconds,
        "prep_seconds": costs.prep_seconds,
        "restore_local_seconds": costs.restore(costs.local_gb_per_second),
        "restore_peer_seconds": costs.restore(costs.peer_gb_per_second),
        "program_load_seconds": costs.program_load_seconds,
        "save_seconds": costs.snapshot(),
    }


def comparison(figures: dict[str, Any]) -> str:
    """The replay as text: measured and predicted side by side."""
    measured, predicted = figures["measured"], figures["predicted"]
    lines = [
        f"replay of {figures['report']}: {figures['hosts']} hosts, {figures['steps']} steps of "
        f"{figures['step_seconds']:g} s, {figures['faults']} fault(s); recovery costs from "
        f"{figures['costs_from']}",
        "",
        f"  {'':<26}{'measured':>12}{'predicted':>12}",
        f"  {'goodput':<26}{measured['goodput']:>12.4f}{predicted['goodput']:>12.4f}",
        f"  {'wall (s)':<26}{measured['wall_seconds']:>12.2f}{predicted['wall_seconds']:>12.2f}",
    ]
    for category in sorted(set(measured["badput_seconds"]) | set(predicted["badput_seconds"])):
        lines.append(
            f"  {category + ' (s)':<26}{measured['badput_seconds'].get(category, 0.0):>12.2f}"
            f"{predicted['badput_seconds'].get(category, 0.0):>12.2f}"
        )
    lines += [
        "",
        f"  decisions measured: {_counts(measured['decisions'])}; "
        f"predicted: {_counts(predicted['decisions'])}",
        f"  predicted - measured goodput: {figures['error']:+.4f}",
    ]
    if figures["not_simulated"]:
        lines.append(f"  not simulated: {'; '.join(figures['not_simulated'])}")
    return "\n".join(lines)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"
