"""The policy benchmark's table (benchmarks/policy.py): its rows over the runs' figures, each with its
target, and their Markdown.

Apart from the runner and the analysis: which figure is shown, under which name and against which
target is a question of its own.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from harness import Row, format_value
from policy_figures import RunFigures, ScaleDownFigures
from policy_scenarios import (
    FLAG_TARGET_STEPS,
    HEALTHY,
    SCALE_DOWN,
    SCALE_DOWN_TARGET_SECONDS,
    SLOW_HOST,
    SLOW_SCENARIOS,
    SLOW_STEP,
)


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
        "healthy: restarts (each a false alarm)",
        HEALTHY.key,
        lambda f: f.restarts,
        "count",
        "0",
        lambda v: v == 0,
    )
    add(
        "healthy: hang reports not confirmed (a slow job, no restart)",
        HEALTHY.key,
        lambda f: f.unconfirmed_hangs,
        "count",
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
