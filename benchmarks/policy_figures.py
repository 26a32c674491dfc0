"""The figures of one run of the policy benchmark (benchmarks/policy.py), from its report and its hosts'
event logs: pure functions over what a run left, no running.

Apart from the runner so that the analysis (the straggler scores replayed through the leader's own
detector, the slow host's realized slowdown, the scale-down's recovery) can be read and changed on
its own.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import RunFailed, read_events, step_intervals
from policy_scenarios import HEALTHY, LOSE_STEP, SCALE_DOWN, SCALE_DOWN_HOSTS, SLOW_HOST, SLOW_STEP, Scenario
from slicekeeper.supervisor.signals.straggler import StragglerDetector


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
    restarts: int = 0
    """In-job restarts, of any kind (in the healthy run, every one a false alarm)."""
    unconfirmed_hangs: int = 0
    """Hang reports the leader found to be a slow job when it asked again (no restart)."""
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
        restarts=sum(int(n) for n in (report.get("restarts") or {}).values()),
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
        parts.append(
            f"{figures.restarts} restart(s), {figures.unconfirmed_hangs} hang report(s) not confirmed"
        )
    max_score = max(figures.replay.max_score.values(), default=float("nan"))
    parts.append(f"{len(figures.stragglers)} flagged; max replayed score {max_score:.2f}")
    return "; ".join(parts)
