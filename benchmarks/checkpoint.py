"""Benchmark of the checkpoint tiers: save stall, cost of the peer and persistent tiers, restore by source.

Why: the local tier is on the training process's critical path (the blocking part of a save), the
peer and persistent tiers are not (the supervisor copies committed steps in the background), and a
restart or a hot-swap stages each host's shard back from the closest valid copy. This script puts
numbers on each of those claims for the reference JAX job, so a change to a tier shows up as a figure.

It runs the example job (`examples/trainingjob.yaml`: 4 host processes x 2 CPU devices) with its
`spec.checkpoint` overridden in a temp YAML (a local save every 10 steps) in six scenarios, each a
subprocess `slicekeeper run JOB --steps N --spares 0|1 [--chaos ...] --report PATH`:

- `local`: peer replicas 0, no persistent tier, no fault;
- `local+peer`: 1 peer replica, no fault;
- `local+peer+persistent`: 1 peer replica, persistent every 20 steps (a temp dir), no fault;
- `kill (local restore)`: 1 peer replica, `kill:host=2@step=S` (every host restores from its local tier);
- `lose (peer restore)`: 1 peer replica, `--spares 1`, `lose:host=1@step=S` (hot-swap; host 1's
  shard comes from its peer replica);
- `lose (persistent restore)`: peer replicas 0, persistent every 10 steps, `--spares 1`,
  `lose:host=1@step=S` (hot-swap; host 1's shard comes from the persistent tier).

Figures, from the reports and the machines' `events.jsonl` (`host-N/`, `spare-N/` under the run dir):

1. save stall: each workload `checkpoint_save` phase event to the next phase event (the blocking
   device-to-host copy; the write runs in the background), per save; and per host, the time in saves
   divided by the time in steps (step_begin -> step_end, the first step of each start left out since
   it compiles), mean over hosts, for each of the three fault-free scenarios. Target: <= 2 %.
   Cost of the background tiers: the median step time of each fault-free scenario and its difference
   to `local`; the median of the 3 steps after each save (they carry the save's background work:
   the local write, then the peer push, then the upload), comparable across the three scenarios;
   and the median of the steps that overlap a peer push or a persistent upload (any machine's
   `replicated` / `persisted` record, [t - seconds, t]).
2. peer replication (`replicated` records: seconds and MB per push of one host's shard to one holder)
   and persistent upload (`persisted` records: seconds and MB per host shard).
3. restore by source: the supervisors' staging seconds from the report's `restores` (median over the
   shards staged from the scenario's tier in the first restart) and the workload's
   `checkpoint_restore` phase (mean over hosts; it always reads the local tier, after staging).
4. recovery: loss (or kill) detected -> first step completed after the restart (`resumed_at -
   detected_at`) and -> first step beyond the pre-fault high-water mark (`productive_at -
   detected_at`). Target for the peer hot-swap: both <= 15 s, and 0 persistent reads. A fault at
   a multiple of the interval (step 50, the default) is the worst case: it fires as the step
   begins, so the restart restores step 40 and executes steps 41-49 again.

A run fails (the script goes on with the others, then exits 1) when `slicekeeper run` fails or
times out, the fault was not recovered from, the faulted host did not restore from the scenario's
tier, or an expected record kind is missing. Oddities that do not invalidate a figure (copies
missing for some committed steps, failed copies, extra restarts) are listed under the table.
With `--runs N` the scenarios are interleaved (run 1 of each, then run 2 of each, ...) and the table
shows the median, min and max over runs.

    .venv/bin/python benchmarks/checkpoint.py [--runs 1] [--steps 80] [--fault-step 50] [--json out.json]

Runs, event logs and the table are read and written with benchmarks/harness.py (imported from this
directory, as the other benchmarks do).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from harness import (
    DEFAULT_JOB,
    Row,
    RunFailed,
    checkpoint_save_seconds,
    finish,
    format_table,
    read_events,
    read_run_report,
    run_once,
    say,
    slicekeeper_command,
    step_durations,
    step_intervals,
    tail,
)

from slicekeeper.api import load_training_job
from slicekeeper.errors import UserError

CHECKPOINT_INTERVAL = 10
STALL_TARGET_PERCENT = 2.0
HOT_SWAP_TARGET_SECONDS = 15.0
PERSISTENT_READS_TARGET = 0
MB = 1e6
AFTER_SAVE_STEPS = 3
"""Steps after a save that carry its background work: the local write, the peer push, the upload."""


# --- scenarios --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    replicas: int
    persistent_interval: int | None
    fault: str | None = None
    """`kill` or `lose` (of FAULT_HOSTS[fault] at the fault step), or None."""
    spares: int = 0
    restore_tier: str | None = None
    """The tier the faulted host's shard must be staged from."""

    def chaos(self, fault_step: int) -> str | None:
        if self.fault is None:
            return None
        return f"{self.fault}:host={FAULT_HOSTS[self.fault]}@step={fault_step}"


FAULT_HOSTS = {"kill": 2, "lose": 1}

LOCAL, PEER, PERSISTENT = "local", "local+peer", "local+peer+persistent"
KILL, LOSE_PEER, LOSE_PERSISTENT = "kill-local", "lose-peer", "lose-persistent"
SCENARIOS = [
    Scenario(LOCAL, "local only", replicas=0, persistent_interval=None),
    Scenario(PEER, "local+peer", replicas=1, persistent_interval=None),
    Scenario(PERSISTENT, "local+peer+persistent", replicas=1, persistent_interval=20),
    Scenario(KILL, "kill (local restore)", 1, None, fault="kill", restore_tier="local"),
    Scenario(LOSE_PEER, "lose (peer restore)", 1, None, fault="lose", spares=1, restore_tier="peer"),
    Scenario(
        LOSE_PERSISTENT,
        "lose (persistent restore)",
        0,
        10,
        fault="lose",
        spares=1,
        restore_tier="persistent",
    ),
]


def write_job(base: dict[str, Any], scenario: Scenario, persistent_dir: Path, path: Path) -> None:
    """The base TrainingJob with spec.checkpoint overridden for the scenario, as YAML at `path`."""
    document = json.loads(json.dumps(base))  # a deep copy
    checkpoint = dict(document["spec"].get("checkpoint") or {})
    checkpoint["interval"] = CHECKPOINT_INTERVAL
    checkpoint["peer"] = {**checkpoint.get("peer", {}), "replicas": scenario.replicas}
    checkpoint.pop("persistent", None)
    if scenario.persistent_interval is not None:
        checkpoint["persistent"] = {"uri": str(persistent_dir), "interval": scenario.persistent_interval}
    document["spec"]["checkpoint"] = checkpoint
    path.write_text(yaml.safe_dump(document, sort_keys=False))


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


# --- the table --------------------------------------------------------------------------------------
def build_rows(runs: dict[str, list[RunFigures]]) -> list[Row]:
    """The table rows, over the scenarios that have figures (each row: one value per run)."""
    rows: list[Row] = []

    def values(key: str, get: Callable[[RunFigures], float | None]) -> list[float]:
        return [float(v) for f in runs.get(key, []) if (v := get(f)) is not None]

    def add(
        metric: str,
        vals: list[float],
        unit: str,
        target: str = "-",
        limit: Callable[[float], bool] | None = None,
    ) -> None:
        if vals:
            rows.append(Row(metric, vals, unit, target, [limit(v) for v in vals] if limit else []))

    add("local save, blocking part per save", values(LOCAL, lambda f: f.save_seconds_mean * 1000), "ms")
    for key in (LOCAL, PEER, PERSISTENT):
        add(
            f"save stall / time in steps [{key}]",
            values(key, lambda f: 100 * f.stall_fraction),
            "%",
            f"<= {STALL_TARGET_PERCENT:g} %",
            lambda v: v <= STALL_TARGET_PERCENT,
        )
    for key in (LOCAL, PEER, PERSISTENT):
        add(f"median step time [{key}]", values(key, lambda f: f.step_median), "s")
    local_steps = [f.step_median for f in runs.get(LOCAL, [])]
    for key in (PEER, PERSISTENT):
        pairs = list(zip(runs.get(key, []), local_steps, strict=False))
        add(
            f"median step time [{key}] vs [{LOCAL}]",
            [100 * (f.step_median - base) / base for f, base in pairs],
            "%",
        )
    for key in (LOCAL, PEER, PERSISTENT):
        add(
            f"median of the {AFTER_SAVE_STEPS} steps after a save [{key}]",
            values(key, lambda f: f.after_save_step_median),
            "s",
        )
    for key in (PEER, PERSISTENT):
        add(f"median of steps overlapping a copy [{key}]", values(key, lambda f: f.copy_step_median), "s")

    def copy_values(key: str, kind: str, get: Callable[[list[Copy]], float]) -> list[float]:
        out = []
        for figures in runs.get(key, []):
            records = figures.replicated if kind == "replicated" else figures.persisted
            if records:
                out.append(float(get(records)))
        return out

    for label, key, kind in (
        ("peer push (one shard to one holder)", PEER, "replicated"),
        ("persistent upload (one shard)", PERSISTENT, "persisted"),
    ):
        add(
            f"{label}, median", copy_values(key, kind, lambda r: statistics.median(c.seconds for c in r)), "s"
        )
        add(f"{label}, max", copy_values(key, kind, lambda r: max(c.seconds for c in r)), "s")
        size = copy_values(key, kind, lambda r: statistics.median(c.bytes for c in r) / MB)
        add(f"{label.split(' (')[0]} size (MB)", size, "")

    for key, source in ((KILL, "local"), (LOSE_PEER, "peer"), (LOSE_PERSISTENT, "persistent")):
        add(
            f"restore staging from {source} [{key}]",
            values(key, lambda f: f.restore.seconds * 1000 if f.restore else None),
            "ms",
        )
    for key in (KILL, LOSE_PEER, LOSE_PERSISTENT):
        add(
            f"workload checkpoint_restore phase [{key}]",
            values(key, lambda f: f.restore.workload_restore_seconds if f.restore else None),
            "s",
        )

    hot_swap_target = f"<= {HOT_SWAP_TARGET_SECONDS:g} s"
    for key, name in ((KILL, "kill restart"), (LOSE_PEER, "hot-swap"), (LOSE_PERSISTENT, "hot-swap")):
        targeted = key == LOSE_PEER
        add(
            f"{name}: detected -> resumed [{key}]",
            values(key, lambda f: f.recovery.resumed_seconds if f.recovery else None),
            "s",
            hot_swap_target if targeted else "-",
            (lambda v: v <= HOT_SWAP_TARGET_SECONDS) if targeted else None,
        )
        add(
            f"{name}: detected -> productive [{key}]",
            values(key, lambda f: f.recovery.productive_seconds if f.recovery else None),
            "s",
            hot_swap_target if targeted else "-",
            (lambda v: v <= HOT_SWAP_TARGET_SECONDS) if targeted else None,
        )
    add(
        f"persistent reads (count) [{LOSE_PEER}]",
        values(LOSE_PEER, lambda f: f.recovery.persistent_reads if f.recovery else None),
        "",
        f"= {PERSISTENT_READS_TARGET}",
        lambda v: v == PERSISTENT_READS_TARGET,
    )
    add(
        f"persistent reads (count) [{LOSE_PERSISTENT}]",
        values(LOSE_PERSISTENT, lambda f: f.recovery.persistent_reads if f.recovery else None),
        "",
    )
    add("wall time per run (all scenarios)", [f.wall_seconds for fs in runs.values() for f in fs], "s")
    return rows


# --- running ----------------------------------------------------------------------------------------
RUN_DIR_LINE = re.compile(r"run directory: (\S+)")


def run_dir_from_log(log_path: Path) -> str | None:
    """The run directory `slicekeeper run` announced, for a run that left no report."""
    if not log_path.exists():
        return None
    match = RUN_DIR_LINE.search(log_path.read_text(errors="replace"))
    return match.group(1) if match else None


def run_scenario(
    scenario: Scenario, run: int, args: argparse.Namespace, base: dict[str, Any], work: Path
) -> RunFigures:
    """One run of one scenario; RunFailed (with the run directory in its message) if unusable."""
    name = f"{scenario.key}-{run}"
    job_path, report_path, log_path = (
        work / f"{name}.yaml",
        work / f"{name}.report.json",
        work / f"{name}.log",
    )
    write_job(base, scenario, work / f"{name}.persistent", job_path)
    command = [*slicekeeper_command(), "run", str(job_path), "--steps", str(args.steps)]
    command += ["--spares", str(scenario.spares)]  # explicit: the job file may ask for spares
    chaos = scenario.chaos(args.fault_step)
    if chaos:
        command += ["--chaos", chaos]
    command += ["--report", str(report_path)]
    say(f"{scenario.title}, run {run}/{args.runs}: {' '.join(command[1:])}")
    status, seconds, timed_out = run_once(command, log_path, args.timeout, f"  {name}:")
    report: dict[str, Any] | None = None
    try:
        report = read_run_report(report_path, status, timed_out, args.timeout)
        figures = analyse(scenario, run, report, args.fault_step)
        if status != 0:
            raise RunFailed(f"slicekeeper exited with {status}")
    except (RunFailed, json.JSONDecodeError, KeyError, ValueError, TypeError) as error:
        run_dir = (report or {}).get("run_dir") or run_dir_from_log(log_path) or "unknown"
        reason = error if isinstance(error, RunFailed) else f"unreadable report: {error!r}"
        say(f"{scenario.title}, run {run}: FAILED after {seconds:.0f} s: {reason}")
        say(f"    run directory {run_dir}; log {log_path}")
        say("    " + tail(log_path).replace("\n", "\n    "))
        raise RunFailed(f"{scenario.title}, run {run}: {reason}; run directory {run_dir}") from None
    say(f"{scenario.title}, run {run}: ok in {seconds:.0f} s; {progress_line(figures)}")
    for note in figures.notes:
        say(f"    note: {note}")
    return figures


# --- entry ------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Measure the checkpoint tiers: save stall, cost of peer/persistent copies, restore "
        "time by source, hot-swap recovery (local mode, six scenarios per run)."
    )
    parser.add_argument("--runs", type=int, default=1, help="runs per scenario (default 1; medians when >1)")
    parser.add_argument("--steps", type=int, default=80, help="training steps per run (default 80)")
    parser.add_argument(
        "--fault-step",
        type=int,
        help="step at which the kill / lose faults fire (default: 50, or steps - 10 if smaller)",
    )
    parser.add_argument(
        "--job", type=Path, default=DEFAULT_JOB, help="TrainingJob YAML (default: the example)"
    )
    parser.add_argument("--json", type=Path, help="write the raw figures of every run and the summary here")
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds before a run is stopped (default 600)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep every run's directory and log (default: only failed runs')"
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.steps < 1:
        parser.error("--runs and --steps must be at least 1")
    if args.fault_step is None:
        args.fault_step = min(50, args.steps - 10)
    if not CHECKPOINT_INTERVAL < args.fault_step < args.steps:
        parser.error(
            f"the fault step ({args.fault_step}) must be after the first save (step {CHECKPOINT_INTERVAL}) "
            f"and before the last step ({args.steps}); raise --steps or set --fault-step"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = yaml.safe_load(args.job.read_text())
    work = Path(tempfile.mkdtemp(prefix="slicekeeper-bench-checkpoint-"))
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    machine = f"{platform.node()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"
    say(
        f"checkpoint benchmark: {len(SCENARIOS)} scenarios x {args.runs} run(s) of {args.steps} steps, "
        f"local save every {CHECKPOINT_INTERVAL} steps, faults at step {args.fault_step}"
    )
    say(f"  started {started_at} on {machine}; load average {os.getloadavg()[0]:.2f}; work dir {work}")

    try:  # a job file `slicekeeper run` would refuse fails here, once, not in every run
        for scenario in SCENARIOS:
            path = work / f"{scenario.key}-check.yaml"
            write_job(base, scenario, work / "persistent-check", path)
            load_training_job(path)
    except (UserError, KeyError, TypeError, AttributeError) as error:
        say(f"{args.job} with the scenarios' spec.checkpoint is not a valid TrainingJob: {error}")
        shutil.rmtree(work, ignore_errors=True)
        return 2

    runs: dict[str, list[RunFigures]] = {}
    failures: list[str] = []
    for run in range(1, args.runs + 1):
        for scenario in SCENARIOS:
            try:
                figures = run_scenario(scenario, run, args, base, work)
            except RunFailed as error:
                failures.append(str(error))
                continue
            runs.setdefault(scenario.key, []).append(figures)
            if not args.keep:
                shutil.rmtree(figures.run_dir, ignore_errors=True)

    rows = build_rows(runs)
    if rows:
        say("")
        say(
            f"{args.runs} run(s) per scenario, {args.steps} steps each, local save every "
            f"{CHECKPOINT_INTERVAL} steps, faults at step {args.fault_step}; median/min/max over runs"
        )
        say(format_table(rows, args.runs))
    notes = [f"{f.scenario} run {f.run}: {note}" for fs in runs.values() for f in fs for note in f.notes]
    if notes:
        say("")
        say("notes:")
        for note in notes:
            say(f"  {note}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "started_at": started_at,
                    "machine": machine,
                    "cpu_count": os.cpu_count(),
                    "runs_requested": args.runs,
                    "steps": args.steps,
                    "fault_step": args.fault_step,
                    "checkpoint_interval": CHECKPOINT_INTERVAL,
                    "job": str(args.job),
                    "failures": failures,
                    "summary": [row.summary() for row in rows],
                    "runs": {key: [asdict(f) for f in fs] for key, fs in runs.items()},
                },
                indent=1,
            )
        )
        say(f"raw figures: {args.json}")
    if failures:
        say("")
    return finish(failures, work, args.keep)


if __name__ == "__main__":
    sys.exit(main())
