"""The figures of one run of the checkpoint benchmark (benchmarks/checkpoint.py), from its report and its
machines' event logs: pure functions over what a run left, no running.

Apart from the runner so that the analysis (save stall, copies to the background tiers, restore by
source, recovery) can be read and changed on its own.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkpoint_scenarios import AFTER_SAVE_STEPS, CHECKPOINT_INTERVAL, FAULT_HOSTS, MB, Scenario
from harness import RunFailed, checkpoint_save_seconds, read_events, step_durations, step_intervals


# --- figures of one run -----------------------------------------------------------------------------
@dataclass
class Copy:
    """One `replicated` or `persisted` record."""

    machine: str
    step: int
    seconds: float
    bytes: int
    t: float


@dataclass
class RestoreFigures:
    generation: int
    step: int
    tier: str
    seconds: float
    """Median staging seconds over the shards staged from `tier` (report `restores`)."""
    shards: int
    megabytes: float | None
    """Median size of those shards (`staged` records), MB."""
    workload_restore_seconds: float | None
    """Mean over machines of the workload's checkpoint_restore phase in that generation."""
    tiers: dict[str, str]
    """Host -> tier, every shard of that restart."""


@dataclass
class RecoveryFigures:
    kind: str
    detection_seconds: float
    resumed_seconds: float
    productive_seconds: float
    persistent_reads: int
    hot_swaps: int


@dataclass
class RunFigures:
    scenario: str
    run: int
    run_dir: str
    wall_seconds: float
    step_median: float
    step_count: int
    saves: int
    save_seconds_mean: float
    stall_fraction: float
    """Mean over machines of (time in checkpoint_save) / (time in steps)."""
    replicated: list[Copy] = field(default_factory=list)
    persisted: list[Copy] = field(default_factory=list)
    copy_step_median: float | None = None
    """Median duration of the steps overlapping a peer push or a persistent upload."""
    copy_steps: int = 0
    after_save_step_median: float | None = None
    """Median duration of the AFTER_SAVE_STEPS steps following each save (local write, then copies)."""
    restore: RestoreFigures | None = None
    recovery: RecoveryFigures | None = None
    notes: list[str] = field(default_factory=list)


def phase_seconds(events: list[dict[str, Any]], phase: str, generation: int) -> list[float]:
    """Each `phase` of the workload of `generation`: its phase event to the next phase event."""
    spans = []
    opened: float | None = None
    for event in events:
        if event.get("source") != "workload" or event["type"] != "phase":
            continue
        if int(event.get("generation", -1)) != generation:
            continue
        t = float(event["t"])
        if opened is not None:
            spans.append(t - opened)
        opened = t if event["phase"] == phase else None
    return spans


def copies(machine: str, events: list[dict[str, Any]], kind: str) -> list[Copy]:
    return [
        Copy(machine, int(e["step"]), float(e["seconds"]), int(e["bytes"]), float(e["t"]))
        for e in events
        if e.get("source") == "supervisor" and e["type"] == kind
    ]


def committed_steps(events: list[dict[str, Any]]) -> set[int]:
    return {
        int(e["step"]) for e in events if e.get("source") == "workload" and e["type"] == "checkpoint_saved"
    }


def missing_copies(
    machine_events: dict[str, list[dict[str, Any]]], kind: str, expected_per_step: int, every: int
) -> list[str]:
    """Committed local steps (multiples of `every`) with fewer `kind` records than expected, per machine."""
    notes = []
    for machine, events in machine_events.items():
        made: dict[int, int] = {}
        for copy in copies(machine, events, kind):
            made[copy.step] = made.get(copy.step, 0) + 1
        short = sorted(
            s for s in committed_steps(events) if s % every == 0 and made.get(s, 0) < expected_per_step
        )
        if short:
            notes.append(f"{machine}: no {kind} record for committed step(s) {short}")
    return notes


def analyse(scenario: Scenario, run: int, report: dict[str, Any], fault_step: int) -> RunFigures:
    """The figures of one run from its report and its machines' event logs; RunFailed if unusable."""
    if report.get("state") != "succeeded":
        raise RunFailed(f"job {report.get('state')}: {report.get('failure_reason')}")
    run_dir = Path(report["run_dir"])
    machine_events = {path.parent.name: read_events(path) for path in sorted(run_dir.glob("*/events.jsonl"))}
    if not any(name.startswith("host-") for name in machine_events):
        raise RunFailed(f"no host-*/events.jsonl under {run_dir}")

    durations = [d for events in machine_events.values() for d in step_durations(events)]
    if not durations:
        raise RunFailed("no completed steps in the event logs")
    saves = [s for events in machine_events.values() for s in checkpoint_save_seconds(events)]
    if not saves:
        raise RunFailed("no checkpoint_save phase in the event logs")
    fractions = [
        sum(checkpoint_save_seconds(events)) / in_steps
        for events in machine_events.values()
        if (in_steps := sum(step_durations(events))) > 0
    ]
    figures = RunFigures(
        scenario=scenario.key,
        run=run,
        run_dir=str(run_dir),
        wall_seconds=float(report["wall_seconds"]),
        step_median=statistics.median(durations),
        step_count=len(durations),
        saves=len(saves),
        save_seconds_mean=statistics.fmean(saves),
        stall_fraction=statistics.fmean(fractions),
    )

    # Copies to the background tiers.
    for machine, events in machine_events.items():
        figures.replicated += copies(machine, events, "replicated")
        figures.persisted += copies(machine, events, "persisted")
        failed = [e for e in events if e.get("source") == "supervisor" and e["type"] == "checkpoint_failed"]
        for event in failed:
            what = f"{event.get('tier')} copy of step {event.get('step')}"
            figures.notes.append(f"{machine}: {what} failed: {event.get('detail')}")
    if scenario.replicas and not figures.replicated:
        raise RunFailed("peer replicas configured but no `replicated` record in any events.jsonl")
    if scenario.persistent_interval and not figures.persisted:
        raise RunFailed("persistent tier configured but no `persisted` record in any events.jsonl")
    if scenario.fault is None:  # with a fault, copies cut short by the stop are expected
        if scenario.replicas:
            figures.notes += missing_copies(
                machine_events, "replicated", scenario.replicas, CHECKPOINT_INTERVAL
            )
        if scenario.persistent_interval:
            figures.notes += missing_copies(machine_events, "persisted", 1, scenario.persistent_interval)
    windows = [(c.t - c.seconds, c.t) for c in figures.replicated + figures.persisted]
    if windows:
        overlapping = [
            end - begin
            for events in machine_events.values()
            for _, begin, end in step_intervals(events)
            if any(begin < w_end and w_begin < end for w_begin, w_end in windows)
        ]
        figures.copy_steps = len(overlapping)
        figures.copy_step_median = statistics.median(overlapping) if overlapping else None
    after_save = [
        end - begin
        for events in machine_events.values()
        for step, begin, end in step_intervals(events)
        if 1 <= step % CHECKPOINT_INTERVAL <= AFTER_SAVE_STEPS
    ]
    figures.after_save_step_median = statistics.median(after_save) if after_save else None

    if scenario.fault is not None:
        figures.recovery = recovery_figures(scenario, report, fault_step, figures.notes)
        figures.restore = restore_figures(scenario, report, machine_events, fault_step, figures.notes)
    elif report.get("faults") or report.get("restores"):
        figures.notes.append("a fault-free run recorded faults or restores")
    return figures


def recovery_figures(
    scenario: Scenario, report: dict[str, Any], fault_step: int, notes: list[str]
) -> RecoveryFigures:
    assert scenario.fault is not None
    faults = [f for f in report.get("faults", []) if f["kind"] == scenario.fault]
    if len(faults) != 1:
        raise RunFailed(f"expected one {scenario.fault} fault in the report, found {len(faults)}")
    fault = faults[0]
    where = f"fault {fault['kind']} host {fault['host']} @ step {fault['step']}"
    for key in ("detected_at", "resumed_at", "productive_at"):
        if fault.get(key) is None:
            raise RunFailed(f"{where}: no {key} in the report")
    swaps = report.get("hot_swaps", {})
    if scenario.fault == "lose" and FAULT_HOSTS["lose"] not in swaps.get("hosts", []):
        raise RunFailed(f"{where}: no hot-swap of host {FAULT_HOSTS['lose']} in the report")
    if int(report.get("generations", 1)) > 2:
        notes.append(f"{report['generations']} generations (one restart expected)")
    return RecoveryFigures(
        kind=fault["kind"],
        detection_seconds=float(fault["detected_at"]) - float(fault["fired_at"]),
        resumed_seconds=float(fault["resumed_at"]) - float(fault["detected_at"]),
        productive_seconds=float(fault["productive_at"]) - float(fault["detected_at"]),
        persistent_reads=int(report.get("persistent_reads", 0)),
        hot_swaps=int(swaps.get("count", 0)),
    )


def restore_figures(
    scenario: Scenario,
    report: dict[str, Any],
    machine_events: dict[str, list[dict[str, Any]]],
    fault_step: int,
    notes: list[str],
) -> RestoreFigures:
    assert scenario.fault is not None and scenario.restore_tier is not None
    restores = [r for r in report.get("restores", []) if r.get("generation") is not None]
    if not restores:
        raise RunFailed("no restore in the report")
    generation = min(int(r["generation"]) for r in restores)
    restart = [r for r in restores if int(r["generation"]) == generation]
    tiers = {str(r["host"]): str(r["tier"]) for r in restart}
    host = FAULT_HOSTS[scenario.fault]
    if tiers.get(str(host)) != scenario.restore_tier:
        raise RunFailed(
            f"host {host} staged its shard from {tiers.get(str(host), 'nowhere')}, "
            f"expected {scenario.restore_tier} (restores of generation {generation}: {tiers})"
        )
    others = {h: t for h, t in tiers.items() if h != str(host) and t != "local"}
    if others:
        notes.append(f"other hosts did not restore from their local tier: {others}")
    step = int(restart[0]["step"])
    expected_step = (fault_step - 1) // CHECKPOINT_INTERVAL * CHECKPOINT_INTERVAL
    if step != expected_step:
        notes.append(
            f"restored step {step}, expected {expected_step} (the last save before step {fault_step})"
        )
    from_tier = [r for r in restart if r["tier"] == scenario.restore_tier and r.get("seconds") is not None]
    staged_bytes = [
        int(e["bytes"])
        for events in machine_events.values()
        for e in events
        if e.get("source") == "supervisor"
        and e["type"] == "staged"
        and e.get("tier") == scenario.restore_tier
        and int(e["step"]) == step
    ]
    restore_phases = [
        s
        for events in machine_events.values()
        for s in phase_seconds(events, "checkpoint_restore", generation)
    ]
    if len(restore_phases) < len(restart):
        notes.append(
            f"{len(restore_phases)} workload checkpoint_restore phase(s) for {len(restart)} restored shard(s)"
        )
    return RestoreFigures(
        generation=generation,
        step=step,
        tier=scenario.restore_tier,
        seconds=statistics.median(float(r["seconds"]) for r in from_tier),
        shards=len(from_tier),
        megabytes=statistics.median(staged_bytes) / MB if staged_bytes else None,
        workload_restore_seconds=statistics.fmean(restore_phases) if restore_phases else None,
        tiers=tiers,
    )


def progress_line(figures: RunFigures) -> str:
    parts = [
        f"step {figures.step_median * 1000:.0f} ms",
        f"{figures.saves} saves, {figures.save_seconds_mean * 1000:.1f} ms blocking each "
        f"({100 * figures.stall_fraction:.2f} % of step time)",
    ]
    if figures.replicated:
        seconds = statistics.median(c.seconds for c in figures.replicated)
        parts.append(f"{len(figures.replicated)} peer pushes, {seconds * 1000:.0f} ms median")
    if figures.persisted:
        seconds = statistics.median(c.seconds for c in figures.persisted)
        parts.append(f"{len(figures.persisted)} persistent uploads, {seconds * 1000:.0f} ms median")
    if figures.restore is not None:
        restore = figures.restore
        parts.append(f"step {restore.step} staged from {restore.tier} in {restore.seconds * 1000:.1f} ms")
    if figures.recovery is not None:
        recovery = figures.recovery
        parts.append(
            f"{recovery.kind} detected in {recovery.detection_seconds:.2f} s, resumed "
            f"{recovery.resumed_seconds:.2f} s and productive {recovery.productive_seconds:.2f} s later"
        )
        if recovery.kind == "lose":
            parts.append(f"{recovery.persistent_reads} persistent read(s)")
    return "; ".join(parts)
