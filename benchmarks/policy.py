"""Benchmark of the policy signals: straggler detection latency, false stragglers, elastic scale-down.

Why: the default policy acts on two signals that have no exit code behind them, a host found
straggling and a host gone with no spare to replace it. How soon a slow host is singled out, whether
a healthy job is ever accused, and how long a job scaled down by a slice takes to train again are
the figures issue 4 sets targets for; this script measures them on the reference JAX job, so a change
to the detector, the throttle or the elastic restart shows up as a number.

It runs the example job (`examples/trainingjob.yaml`: 2 slices x 2 hosts, 4 host processes x 2 CPU
devices) as subprocesses `slicekeeper run JOB --steps N --spares 0 [--chaos ...] --report PATH`,
always without a spare, so that a straggler is only reported (with a spare the default policy would
replace it) and a lost host costs its slice:

- `slow-1.5`, `slow-2`: `slow:host=2,factor=F@step=30`. Detection latency in steps is the report's
  `stragglers[].step` of host 2 (the step whose timings completed the detection) minus 30, in seconds
  the `slow` fault's `detected_at - fired_at`. Targets: 1.5x within 30 steps, 2x within 15. A run in
  which host 2 is never flagged counts as "never" (target missed). Also shown: the slowdown the
  throttle really produced (host 2's own work per step over the other hosts', median over the steps
  after 30; the chaos duty-cycles the process, which a loaded machine can partly undo), the score
  host 2 had when flagged, and the highest score any *other* host reached (they wait for host 2 in
  the collectives: their scores must stay low).
- `healthy`: no chaos, long enough for 5 minutes of training (steps = 1.15 x 300 s / the median step
  time measured in the slow runs before their slowdown, or `--healthy-steps`). Target: no straggler
  flagged. The training time (first to last completed step) is checked against the 5 minutes.
- `scale-down`: `lose:host=3@step=40`. With no spare the default policy drops slice 1 (hosts 2 and
  3) and hosts 0 and 1 continue from the newest checkpoint. Figures from the `lose` fault: lost ->
  detected, detected -> first step after the restart (resumed), detected -> first step beyond the
  pre-fault high-water mark (productive; target <= 20 s); and the report's `scale_events` must hold
  one `down` from 4 to 2 hosts.

Scores. The leader keeps its hosts' straggler scores in memory, not in the report, so the script
replays them: every host's `events.jsonl` holds each step's own `work` (the SDK's `work_done()` mark,
what the leader scores), and feeding those to the leader's own `StragglerDetector` (same defaults,
one detector per restart generation, reports in time order) gives the scores the leader computed,
up to the order in which reports arrived. A replayed detection that differs from the report's is
listed as a note. Machine directories are `host-N/` (no spare, so machine N always serves host N).

The slow and scale-down scenarios run `--runs` times, interleaved; the healthy one once, last. The
table shows the median, min and max over runs; a target is met when every run meets it. A run fails
(the script goes on, then exits 1) when `slicekeeper run` fails or times out, or the loss was not
detected or recovered from; a missed target is a figure, not a failure.

    .venv/bin/python benchmarks/policy.py [--runs 3] [--quick] [--skip-healthy] [--json out.json]

Runs, event logs and the table are read and written with benchmarks/harness.py (imported from this
directory, as the other benchmarks do).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness import (
    DEFAULT_JOB,
    Row,
    RunFailed,
    finish,
    format_value,
    read_events,
    read_run_report,
    run_once,
    say,
    slicekeeper_command,
    step_intervals,
    tail,
)
from slicekeeper.supervisor.straggler import StragglerDetector

SLOW_HOST = 2
SLOW_STEP = 30
FLAG_TARGET_STEPS = {1.5: 30, 2.0: 15}
"""Slowdown factor -> steps after the slowdown within which the slow host must be flagged."""
LOST_HOST = 3
LOSE_STEP = 40
SCALE_DOWN_TARGET_SECONDS = 20.0
SCALE_DOWN_HOSTS = (4, 2)
HEALTHY_MINUTES = 5.0
HEALTHY_MARGIN = 1.15
"""Healthy steps = margin x the wanted training time / step time: steps vary with the machine's load."""
FALLBACK_STEP_SECONDS = 0.5
"""Step time assumed for the healthy run's length when no slow run measured one."""


@dataclass(frozen=True)
class Scenario:
    key: str
    chaos: str | None
    factor: float | None = None


def slow_scenario(factor: float) -> Scenario:
    return Scenario(f"slow-{factor:g}", f"slow:host={SLOW_HOST},factor={factor:g}@step={SLOW_STEP}", factor)


SLOW_SCENARIOS = [slow_scenario(factor) for factor in FLAG_TARGET_STEPS]
SCALE_DOWN = Scenario("scale-down", f"lose:host={LOST_HOST}@step={LOSE_STEP}")
HEALTHY = Scenario("healthy", None)


# --- figures of one run -----------------------------------------------------------------------------
@dataclass
class ScoreReplay:
    """The leader's straggler scores, recomputed from the hosts' own work per step."""

    scored_steps: int
    max_score: dict[int, float]
    """Per host, the highest score over the run."""
    max_score_after: dict[int, float]
    """Per host, the highest score at steps after the scenario's fault step (all steps: no fault)."""
    findings: list[tuple[int, int, float]]
    """(host, step, score) of every detection, in order."""


@dataclass
class ScaleDownFigures:
    detection_seconds: float
    resumed_seconds: float
    productive_seconds: float
    down_events: int
    """`scale_events` of kind down from 4 to 2 hosts."""
    other_scale_events: list[str]


@dataclass
class RunFigures:
    scenario: str
    run: int
    wall_seconds: float
    load_average: float
    """1-minute load average when the run started (the machine is shared)."""
    steps: int
    step_seconds: float
    """Median step duration before the fault (slow runs), or over the run."""
    training_seconds: float
    """First to last completed step, any host."""
    stragglers: list[dict[str, Any]]
    decisions: list[str]
    replay: ScoreReplay
    flag_steps: float | None = None
    """Slow runs: steps from the slowdown to host 2's flag (inf: never flagged)."""
    flag_seconds: float | None = None
    flag_score: float | None = None
    slowdown_before: float | None = None
    """Slow runs: host 2's median own work over the others', before the slowdown."""
    slowdown_after: float | None = None
    scale_down: ScaleDownFigures | None = None
    notes: list[str] = field(default_factory=list)
    run_dir: str = ""

    @property
    def wrongly_flagged(self) -> list[int]:
        """Flagged hosts that were not slowed down (every flagged host when nothing was)."""
        slow = SLOW_HOST if self.scenario.startswith("slow-") else None
        return [int(s["host"]) for s in self.stragglers if int(s["host"]) != slow]


# --- reading a run's artifacts ----------------------------------------------------------------------
WorkReport = tuple[float, int, int, int, float | None]
"""(t, generation, host, step, own work seconds) of one completed step."""


def work_reports(run_dir: Path) -> list[WorkReport]:
    """Every completed step of every host (`host-N/events.jsonl`), in time order."""
    reports: list[WorkReport] = []
    for path in sorted(run_dir.glob("host-*/events.jsonl")):
        host = int(path.parent.name.removeprefix("host-"))
        for event in read_events(path):
            if event.get("source") == "workload" and event["type"] == "step_end":
                work = event.get("work")
                reports.append(
                    (
                        float(event["t"]),
                        int(event.get("generation", -1)),
                        host,
                        int(event["step"]),
                        None if work is None else float(work),
                    )
                )
    return sorted(reports)


def replay_scores(reports: list[WorkReport], after_step: int) -> ScoreReplay:
    """Feed the reports to the leader's detector (defaults; reset at each generation, as the leader)."""
    max_score: dict[int, float] = {}
    max_after: dict[int, float] = {}
    findings: list[tuple[int, int, float]] = []
    scored = 0
    for generation in sorted({r[1] for r in reports}):
        mine = [r for r in reports if r[1] == generation]
        detector = StragglerDetector()
        detector.reset({r[2] for r in mine})
        last_scores: dict[int, float] = {}
        for _, _, host, step, work in mine:
            findings += [(f.host, f.step, f.score) for f in detector.observe(host, step, work)]
            scores = detector.scores()
            if scores and scores != last_scores:
                scored += 1
                last_scores = scores
                for scored_host, score in scores.items():
                    max_score[scored_host] = max(score, max_score.get(scored_host, 0.0))
                    if step > after_step:
                        max_after[scored_host] = max(score, max_after.get(scored_host, 0.0))
    return ScoreReplay(scored, max_score, max_after, findings)


def own_work_ratio(reports: list[WorkReport], host: int, steps: range) -> float | None:
    """`host`'s median own work over the median of the other hosts' medians, over `steps` (gen 0)."""
    works: dict[int, list[float]] = {}
    for _, generation, h, step, work in reports:
        if generation == 0 and step in steps and work is not None:
            works.setdefault(h, []).append(work)
    others = [statistics.median(w) for h, w in works.items() if h != host and w]
    if host not in works or not others or statistics.median(others) <= 0:
        return None
    return statistics.median(works[host]) / statistics.median(others)


def describe_decision(decision: dict[str, Any]) -> str:
    event = decision["event"]
    host = f" host {event['host']}" if "host" in event else ""
    action, source = decision["action"]["name"], decision["source"]
    return f"step {decision['step']} {event['kind']}{host} -> {action} ({source})"


def analyse(scenario: Scenario, run: int, report: dict[str, Any], load: float) -> RunFigures:
    """The figures of one run from its report and its hosts' event logs; RunFailed if unusable."""
    if report.get("state") != "succeeded":
        raise RunFailed(f"job {report.get('state')}: {report.get('failure_reason')}")
    run_dir = Path(report["run_dir"])
    reports = work_reports(run_dir)
    if not reports:
        raise RunFailed(f"no completed steps in {run_dir}/host-*/events.jsonl")
    fault_step = SLOW_STEP if scenario.factor else LOSE_STEP if scenario is SCALE_DOWN else 0
    intervals = [
        (step, begin, end)
        for path in sorted(run_dir.glob("host-*/events.jsonl"))
        for step, begin, end in step_intervals(read_events(path))
    ]
    before = [end - begin for step, begin, end in intervals if not fault_step or step < fault_step]
    step_ends = [r[0] for r in reports]
    figures = RunFigures(
        scenario=scenario.key,
        run=run,
        wall_seconds=float(report["wall_seconds"]),
        load_average=load,
        steps=int(report["steps_completed"]),
        step_seconds=statistics.median(before or [end - begin for _, begin, end in intervals]),
        training_seconds=max(step_ends) - min(step_ends),
        stragglers=list(report.get("stragglers") or []),
        decisions=[describe_decision(d) for d in report.get("decisions") or []],
        replay=replay_scores(reports, fault_step),
        run_dir=str(run_dir),
    )
    replayed = [(host, step) for host, step, _ in figures.replay.findings]
    reported = [(int(s["host"]), int(s["step"])) for s in figures.stragglers]
    if replayed != reported:
        figures.notes.append(f"replayed detections {replayed} differ from the report's {reported}")

    if scenario.factor is not None:
        slow = [s for s in figures.stragglers if int(s["host"]) == SLOW_HOST]
        fault = next((f for f in report["faults"] if f["kind"] == "slow"), None)
        if fault is None:
            raise RunFailed("no slow fault in the report (the chaos never fired)")
        if slow:
            figures.flag_steps = float(int(slow[0]["step"]) - SLOW_STEP)
            figures.flag_score = float(slow[0]["score"])
            if fault.get("detected_at") is not None:
                figures.flag_seconds = float(fault["detected_at"]) - float(fault["fired_at"])
            else:
                figures.notes.append("host 2 flagged, but the slow fault has no detected_at")
        else:
            figures.flag_steps = math.inf
            figures.notes.append(f"host {SLOW_HOST} never flagged in {figures.steps} steps")
        figures.slowdown_before = own_work_ratio(reports, SLOW_HOST, range(3, SLOW_STEP))
        figures.slowdown_after = own_work_ratio(reports, SLOW_HOST, range(SLOW_STEP + 1, figures.steps + 1))
    if scenario is SCALE_DOWN:
        figures.scale_down = scale_down_figures(report)
    if figures.wrongly_flagged:
        figures.notes.append(
            "flagged without a slowdown: "
            + ", ".join(
                f"host {s['host']} score {s['score']} at step {s['step']}" for s in figures.stragglers
            )
        )
    return figures


def scale_down_figures(report: dict[str, Any]) -> ScaleDownFigures:
    lose = [f for f in report["faults"] if f["kind"] == "lose"]
    if len(lose) != 1:
        raise RunFailed(f"expected one lose fault in the report, found {len(lose)}")
    fault = lose[0]
    for key in ("detected_at", "resumed_at", "productive_at"):
        if fault.get(key) is None:
            raise RunFailed(f"lose host {fault['host']}: no {key} in the report")
    events = report.get("scale_events") or []
    down = [
        e
        for e in events
        if e["kind"] == "down" and (int(e["from_hosts"]), int(e["to_hosts"])) == SCALE_DOWN_HOSTS
    ]
    detected = float(fault["detected_at"])
    return ScaleDownFigures(
        detection_seconds=detected - float(fault["fired_at"]),
        resumed_seconds=float(fault["resumed_at"]) - detected,
        productive_seconds=float(fault["productive_at"]) - detected,
        down_events=len(down),
        other_scale_events=[
            f"{e['kind']} {e['from_hosts']} -> {e['to_hosts']} at step {e['step']}"
            for e in events
            if e not in down
        ],
    )


def progress_line(figures: RunFigures) -> str:
    parts = [f"step {figures.step_seconds * 1000:.0f} ms", f"load {figures.load_average:.1f}"]
    if figures.flag_steps is not None:
        if math.isinf(figures.flag_steps):
            parts.append(f"host {SLOW_HOST} not flagged")
        else:
            seconds = "?" if figures.flag_seconds is None else f"{figures.flag_seconds:.1f}"
            parts.append(
                f"host {SLOW_HOST} flagged {figures.flag_steps:.0f} steps ({seconds} s) after the slowdown, "
                f"score {figures.flag_score:.2f}"
            )
        if figures.slowdown_after is not None:
            parts.append(f"realized slowdown {figures.slowdown_after:.2f}x")
    if figures.scale_down is not None:
        s = figures.scale_down
        parts.append(
            f"loss detected in {s.detection_seconds:.2f} s, resumed {s.resumed_seconds:.1f} s and "
            f"productive {s.productive_seconds:.1f} s later; {s.down_events} scale-down 4 -> 2"
        )
    if figures.scenario == HEALTHY.key:
        parts.append(f"{figures.training_seconds:.0f} s of training")
    max_score = max(figures.replay.max_score.values(), default=float("nan"))
    parts.append(f"{len(figures.stragglers)} flagged; max replayed score {max_score:.2f}")
    return "; ".join(parts)


# --- the table --------------------------------------------------------------------------------------
def format_cell(value: float, unit: str) -> str:
    if math.isinf(value):
        return "never"
    if unit == "steps":
        return f"{value:.0f} steps"
    if unit == "x":
        return f"{value:.2f}"
    if unit == "count":
        return f"{value:.0f}"
    return format_value(value, unit)


def format_rows(rows: list[Row]) -> str:
    """A Markdown table: metric, median, min, max, target, met? (met: in every run of the row)."""
    header = ["metric", "median", "min", "max", "target", "met?"]
    lines = [header]
    for row in rows:
        met = "-" if not row.met else "yes" if all(row.met) else f"no ({sum(row.met)}/{len(row.met)} runs)"
        summary = (statistics.median(row.values), min(row.values), max(row.values))
        lines.append([row.metric, *(format_cell(v, row.unit) for v in summary), row.target, met])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + " |" for line in lines]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def build_rows(runs: dict[str, list[RunFigures]], healthy_seconds: float) -> list[Row]:
    rows: list[Row] = []

    def add(
        metric: str,
        key: str,
        get: Callable[[RunFigures], float | None],
        unit: str,
        target: str = "-",
        limit: Callable[[float], bool] | None = None,
    ) -> None:
        values = [float(v) for f in runs.get(key, []) if (v := get(f)) is not None]
        if values:
            rows.append(Row(metric, values, unit, target, [limit(v) for v in values] if limit else []))

    slow_runs = [f for s in SLOW_SCENARIOS for f in runs.get(s.key, [])]
    if slow_runs:
        rows.append(
            Row("step time before the slowdown (slow runs)", [f.step_seconds for f in slow_runs], "s")
        )
    for scenario in SLOW_SCENARIOS:
        assert scenario.factor is not None
        name, key, limit = f"{scenario.factor:g}x", scenario.key, FLAG_TARGET_STEPS[scenario.factor]
        add(
            f"{name}: realized slowdown of host 2 (own work / others')",
            key,
            lambda f: f.slowdown_after,
            "x",
        )
        add(
            f"{name}: slowdown -> host 2 flagged, steps",
            key,
            lambda f: f.flag_steps,
            "steps",
            f"<= {limit} steps",
            at_most(limit),
        )
        add(f"{name}: slowdown -> host 2 flagged, seconds", key, lambda f: f.flag_seconds, "s")
        add(f"{name}: host 2's score when flagged", key, lambda f: f.flag_score, "x")
        add(
            f"{name}: max score of the other hosts after step {SLOW_STEP} (replayed)",
            key,
            lambda f: max((s for h, s in f.replay.max_score_after.items() if h != SLOW_HOST), default=None),
            "x",
        )
        add(f"{name}: other hosts flagged", key, lambda f: len(f.wrongly_flagged), "count")
    minutes = f"{healthy_seconds / 60:g} min"
    add(
        "healthy: training time (first to last step)",
        HEALTHY.key,
        lambda f: f.training_seconds,
        "s",
        f">= {healthy_seconds:g} s",
        lambda v: v >= healthy_seconds,
    )
    add("healthy: step time", HEALTHY.key, lambda f: f.step_seconds, "s")
    add(
        "healthy: stragglers flagged",
        HEALTHY.key,
        lambda f: len(f.stragglers),
        "count",
        f"0 in {minutes}",
        lambda v: v == 0,
    )
    add(
        "healthy: max score of any host (replayed; flag: >= 1.3 for 6 steps)",
        HEALTHY.key,
        lambda f: max(f.replay.max_score.values(), default=None),
        "x",
    )
    key = SCALE_DOWN.key
    add("scale-down: loss detected (lose -> host_lost)", key, lambda f: sd(f).detection_seconds, "s")
    add("scale-down: detected -> resumed", key, lambda f: sd(f).resumed_seconds, "s")
    add(
        "scale-down: detected -> productive",
        key,
        lambda f: sd(f).productive_seconds,
        "s",
        f"<= {SCALE_DOWN_TARGET_SECONDS:g} s",
        lambda v: v <= SCALE_DOWN_TARGET_SECONDS,
    )
    add(
        "scale-down: scale_events down 4 -> 2 hosts",
        key,
        lambda f: sd(f).down_events,
        "count",
        "= 1",
        lambda v: v == 1,
    )
    add("scale-down: stragglers flagged (no slowdown)", key, lambda f: len(f.stragglers), "count")
    add(
        "scale-down: max score after the loss (replayed)",
        key,
        lambda f: max(f.replay.max_score_after.values(), default=None),
        "x",
    )
    short_runs = [f.wall_seconds for key, fs in runs.items() if key != HEALTHY.key for f in fs]
    if short_runs:
        rows.append(Row("wall time per slow / scale-down run", short_runs, "s"))
    add("wall time of the healthy run", HEALTHY.key, lambda f: f.wall_seconds, "s")
    return rows


def at_most(limit: float) -> Callable[[float], bool]:
    return lambda value: value <= limit


def sd(figures: RunFigures) -> ScaleDownFigures:
    assert figures.scale_down is not None
    return figures.scale_down


# --- running ----------------------------------------------------------------------------------------
def run_scenario(
    scenario: Scenario, run: int, runs: int, steps: int, args: argparse.Namespace, work: Path
) -> RunFigures:
    """One run of one scenario; RunFailed (with the run directory in its message) if unusable."""
    name = f"{scenario.key}-{run}"
    report_path, log_path = work / f"{name}.report.json", work / f"{name}.log"
    command = [*slicekeeper_command(), "run", str(args.job), "--steps", str(steps), "--spares", "0"]
    if scenario.chaos:
        command += ["--chaos", scenario.chaos]
    command += ["--report", str(report_path)]
    load = os.getloadavg()[0]
    say(f"{scenario.key}, run {run}/{runs} (load {load:.1f}): {' '.join(command[1:])}")
    status, seconds, timed_out = run_once(command, log_path, args.timeout, f"  {name}:")
    report: dict[str, Any] | None = None
    try:
        report = read_run_report(report_path, status, timed_out, args.timeout)
        figures = analyse(scenario, run, report, load)
        if status != 0:
            raise RunFailed(f"slicekeeper exited with {status}")
    except (RunFailed, json.JSONDecodeError, KeyError, ValueError, TypeError) as error:
        run_dir = (report or {}).get("run_dir") or "unknown (see the log)"
        reason = error if isinstance(error, RunFailed) else f"unreadable report: {error!r}"
        say(f"{scenario.key}, run {run}: FAILED after {seconds:.0f} s: {reason}")
        say(f"    run directory {run_dir}; log {log_path}")
        say("    " + tail(log_path).replace("\n", "\n    "))
        raise RunFailed(f"{scenario.key}, run {run}: {reason}; run directory {run_dir}") from None
    say(f"{scenario.key}, run {run}: ok in {seconds:.0f} s; {progress_line(figures)}")
    for note in figures.notes:
        say(f"    note: {note}")
    return figures


def healthy_steps(args: argparse.Namespace, runs: dict[str, list[RunFigures]]) -> int:
    if args.healthy_steps is not None:
        steps: int = args.healthy_steps
        return steps
    measured = [f.step_seconds for s in SLOW_SCENARIOS for f in runs.get(s.key, [])]
    step = statistics.median(measured) if measured else FALLBACK_STEP_SECONDS
    minutes: float = args.healthy_minutes
    return math.ceil(HEALTHY_MARGIN * minutes * 60 / step)


# --- entry ------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Measure straggler detection latency, false stragglers in a healthy run and the "
        "elastic scale-down's recovery (local mode, no spare)."
    )
    parser.add_argument("--runs", type=int, help="runs of the slow and scale-down scenarios (default 3)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 run each, shorter runs, a 2-minute healthy run (a smoke test of the figures)",
    )
    parser.add_argument("--skip-healthy", action="store_true", help="leave out the healthy run")
    parser.add_argument(
        "--healthy-minutes",
        type=float,
        help=f"training time of the healthy run (default {HEALTHY_MINUTES:g}; --quick: 2)",
    )
    parser.add_argument(
        "--healthy-steps", type=int, help="steps of the healthy run (default: from the measured step time)"
    )
    parser.add_argument(
        "--job", type=Path, default=DEFAULT_JOB, help="TrainingJob YAML (default: the example)"
    )
    parser.add_argument("--json", type=Path, help="write the raw figures of every run and the summary here")
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="seconds before a run is stopped (default 900)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep every run's directory and log (default: only failed runs')"
    )
    args = parser.parse_args(argv)
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    if args.healthy_minutes is None:
        args.healthy_minutes = 2.0 if args.quick else HEALTHY_MINUTES
    args.slow_steps = SLOW_STEP + (40 if args.quick else 50)
    args.scale_down_steps = LOSE_STEP + (20 if args.quick else 30)
    if (
        args.runs < 1
        or args.healthy_minutes <= 0
        or (args.healthy_steps is not None and args.healthy_steps < 1)
    ):
        parser.error("--runs, --healthy-minutes and --healthy-steps must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="slicekeeper-bench-policy-"))
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    started = time.monotonic()
    machine = f"{platform.node()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"
    say(
        f"policy benchmark: {args.runs} run(s) of slow 1.5x / 2x ({args.slow_steps} steps, host {SLOW_HOST} "
        f"from step {SLOW_STEP}) and scale-down ({args.scale_down_steps} steps, lose host {LOST_HOST} at "
        f"step {LOSE_STEP}), "
        + ("no healthy run" if args.skip_healthy else f"one healthy run of {args.healthy_minutes:g} min")
    )
    say(f"  started {started_at} on {machine}; load average {os.getloadavg()[0]:.2f}; work dir {work}")

    runs: dict[str, list[RunFigures]] = {}
    failures: list[str] = []
    plan = [(s, args.slow_steps) for s in SLOW_SCENARIOS] + [(SCALE_DOWN, args.scale_down_steps)]
    for run in range(1, args.runs + 1):
        for scenario, steps in plan:
            try:
                figures = run_scenario(scenario, run, args.runs, steps, args, work)
            except RunFailed as error:
                failures.append(str(error))
                continue
            runs.setdefault(scenario.key, []).append(figures)
            if not args.keep:
                shutil.rmtree(figures.run_dir, ignore_errors=True)
    if not args.skip_healthy:
        steps = healthy_steps(args, runs)
        try:
            figures = run_scenario(HEALTHY, 1, 1, steps, args, work)
            runs[HEALTHY.key] = [figures]
            if not args.keep:
                shutil.rmtree(figures.run_dir, ignore_errors=True)
        except RunFailed as error:
            failures.append(str(error))

    healthy_seconds = args.healthy_minutes * 60
    rows = build_rows(runs, healthy_seconds)
    elapsed = time.monotonic() - started
    if rows:
        say("")
        say(
            f"{args.runs} run(s) per slow / scale-down scenario, --spares 0; median/min/max over runs; "
            f"benchmark took {elapsed / 60:.1f} min"
        )
        say(format_rows(rows))
    notes = [f"{f.scenario} run {f.run}: {note}" for fs in runs.values() for f in fs for note in f.notes]
    decisions = [f"{f.scenario} run {f.run}: {'; '.join(f.decisions)}" for fs in runs.values() for f in fs]
    loads = [f.load_average for fs in runs.values() for f in fs]
    if loads:
        say("")
        say(
            f"load average at the start of the runs: {min(loads):.1f} to {max(loads):.1f} "
            f"({os.cpu_count()} cores)"
        )
    if notes:
        say("notes:")
        for note in notes:
            say(f"  {note}")
    if decisions:
        say("decisions:")
        for line in decisions:
            say(f"  {line}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "started_at": started_at,
                    "machine": machine,
                    "cpu_count": os.cpu_count(),
                    "seconds": elapsed,
                    "runs_requested": args.runs,
                    "quick": args.quick,
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
