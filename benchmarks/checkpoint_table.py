"""The checkpoint benchmark's table (benchmarks/checkpoint.py): its rows over the runs' figures, each with
its target.

Apart from the runner and the analysis: which figure is shown, under which name and against which
target is a question of its own.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from checkpoint_figures import Copy, RunFigures
from checkpoint_scenarios import (
    AFTER_SAVE_STEPS,
    HOT_SWAP_TARGET_SECONDS,
    KILL,
    LOCAL,
    LOSE_PEER,
    LOSE_PERSISTENT,
    MB,
    PEER,
    PERSISTENT,
    PERSISTENT_READS_TARGET,
    STALL_TARGET_PERCENT,
)
from harness import Row


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
