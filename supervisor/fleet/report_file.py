"""A simulated run's report, in the format of `slicekeeper run`'s report (slicekeeper.report).

`slicekeeper simulate ... --report PATH` writes the product's run as a report file: the same keys,
times in seconds since the run started, goodput and badput by the same categories, every fault with
its detection and the time training went on, every decision with its event, the worlds and the scale
events. Beside it goes the policy event log (`PATH.events.jsonl`, each decision with its context, as
the leader writes it), so `slicekeeper policy replay` asks another policy about the same events, and
the page (`PATH.html`, slicekeeper.report_page). What a simulation has not got is empty: no
per-host figures (a simulated job has tens of thousands of hosts, all alike), no restores or
checkpoints, no parameters' fingerprint; `simulated` says what was simulated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slicekeeper.supervisor.fleet.outcome import Result
from slicekeeper.supervisor.fleet.simulation import EPOCH

from slicekeeper.goodput import BADPUT, Category
from slicekeeper.report import announced_losses


def simulated_report(
    result: Result, *, job: str, step_seconds: float, simulated: dict[str, Any]
) -> dict[str, Any]:
    """`result` as a run's report (`simulated`: the scenario, under its own key)."""
    badput = result.badput_seconds(digits=3)
    decisions = [{**d, "t": round(d["t"] - EPOCH, 3)} for d in result.decision_records]
    return {
        "job": job,
        "state": "failed" if result.failure_reason else "succeeded",
        "failure_reason": result.failure_reason,
        "steps_completed": int(result.steps),
        "goodput": round(result.goodput, 4),
        "badput_seconds": {c.value: badput.get(c.value, 0.0) for c in BADPUT},
        "productive_seconds": round(result.chip_seconds[Category.PRODUCTIVE] / result.chips, 3),
        "restarts": dict(sorted(result.restarts.items())),
        "faults": [_rounded(f) for f in result.faults],
        "detections": [],
        "params_fingerprint": None,
        "ideal_step_seconds": step_seconds,
        "wall_seconds": round(result.seconds, 3),
        "started_at": EPOCH,
        "generations": result.generations,
        "restores": [],
        "recoveries": [],
        "persistent_reads": 0,
        "persistent_read_bytes": 0,
        "hot_swaps": {
            "count": len(result.hot_swaps),
            "hosts": [s["host"] for s in result.hot_swaps],
            "details": result.hot_swaps,
        },
        "leader_changes": [],
        "failed_saves": {},
        "decisions": decisions,
        "announced_losses": announced_losses(decisions),
        "stragglers": [],
        "world": [_rounded(w) for w in result.worlds],
        "scale_events": [_rounded(e) for e in result.scale_events],
        "persistent_checkpoints": [],
        "persistent_commits": [],
        "hosts": [],
        "simulated": simulated,
    }


def _rounded(record: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in record.items()}


def write(report: dict[str, Any], result: Result, path: Path) -> tuple[Path, Path]:
    """Write the report at `path` and its policy event log beside it; both paths."""
    events = path.with_name(path.stem + ".events.jsonl")
    events.write_text("".join(json.dumps(line) + "\n" for line in result.decision_log), encoding="utf-8")
    path.write_text(json.dumps({**report, "events_log": str(events)}, indent=1), encoding="utf-8")
    return path, events
