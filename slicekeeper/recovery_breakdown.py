"""Where each second of a recovery went, host by host: the report's per-fault breakdown.

A fault's recovery runs from the fault to the first step beyond what the job had done before it
(`productive_at`). The hosts' event logs (slicekeeper.event_logs) say when each part ended, so the
time splits into, per host:

- detect: the fault -> the leader detected it (the same on every host);
- stop: detection -> the leader's `start` of the next generation reached this host (the old workload
  stopped and every host agreed on the restore step);
- launch: that start -> the new workload said hello (shards staged, a standby promoted or a process
  started);
- the workload's own phases in the new generation: distributed init (`tpu_initialization`), prep
  (`training_prep`), restore (`checkpoint_restore`), programs (`program_startup`: loading or
  compiling the programs, and the first gather, which waits for every host);
- first step: its begin -> its end;
- steps again: the end of the first step -> the end of the first step beyond the host's high-water
  mark at the fault (the steps executed again, and that step);
- other: what the parts above leave of the whole (gaps between phases).

Each host's entry also lists the programs its new workload `loaded` (compiled by an earlier start)
and `compiled`, as the workload said (the SDK's `programs` event): a restart at the floor compiles
nothing.

Hosts whose new generation never reached a productive step (another fault came first) have no total.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slicekeeper.event_logs import host_records, number

PHASES = {
    "tpu_initialization": "distributed_init",
    "training_prep": "prep",
    "checkpoint_restore": "restore",
    "program_startup": "programs",
}
"""Workload phase -> the breakdown's part."""

_PHASE_ENDS = ("phase", "step_begin", "step_end", "done")
"""The workload events that end a phase."""

PARTS = ("detect", "stop", "launch", *PHASES.values(), "first_step", "steps_again", "other")
"""The parts of a recovery, in the order they happen."""

LABELS = {
    "detect": "detect",
    "stop": "stop",
    "launch": "launch",
    "distributed_init": "distributed init",
    "prep": "prep",
    "restore": "restore",
    "programs": "programs",
    "first_step": "first step",
    "steps_again": "steps again",
    "other": "other",
}


def _host_parts(records: list[dict[str, Any]], fired: float, detected: float) -> dict[str, Any] | None:
    """One host's parts of the recovery from the fault at `fired` (Unix seconds); None when this host's
    log has no generation started after the detection."""
    start = next(
        (
            r
            for r in records
            if r.get("source") == "leader"
            and r.get("type") == "start"
            and (number(r.get("t")) or 0) >= detected
        ),
        None,
    )
    if start is None or not isinstance(start.get("generation"), int):
        return None
    generation, started = start["generation"], float(start["t"])
    high_water = max(
        (
            r["step"]
            for r in records
            if r.get("type") == "step_end"
            and r.get("source") == "workload"
            and isinstance(r.get("step"), int)
            and (number(r.get("t")) or 0) < detected
        ),
        default=0,
    )
    own = [
        r
        for r in records
        if r.get("source") == "workload"
        and r.get("generation") == generation
        and number(r.get("t")) is not None
    ]
    parts: dict[str, Any] = {"detect": detected - fired, "stop": started - detected}
    hello = next((r for r in own if r.get("type") == "hello"), None)
    if hello is not None:
        parts["launch"] = float(hello["t"]) - started
    # A phase lasts until the next phase or step event (other events, e.g. `programs` or
    # `checkpoint_restored`, are said inside it).
    marks = [r for r in own if r.get("type") in _PHASE_ENDS]
    for index, record in enumerate(marks):
        part = PHASES.get(str(record.get("phase"))) if record.get("type") == "phase" else None
        if part is not None and index + 1 < len(marks):
            parts[part] = parts.get(part, 0.0) + float(marks[index + 1]["t"]) - float(record["t"])
    begins = [r for r in own if r.get("type") == "step_begin"]
    ends = [r for r in own if r.get("type") == "step_end" and isinstance(r.get("step"), int)]
    if begins and ends:
        first_end = float(ends[0]["t"])
        parts["first_step"] = first_end - float(begins[0]["t"])
        productive = next((r for r in ends if r["step"] > high_water), None)
        if productive is not None:
            parts["steps_again"] = float(productive["t"]) - first_end
            parts["total"] = float(productive["t"]) - fired
            parts["other"] = max(0.0, parts["total"] - sum(v for k, v in parts.items() if k != "total"))
    entry: dict[str, Any] = {"generation": generation, **{k: round(v, 3) for k, v in parts.items()}}
    said = [r for r in own if r.get("type") == "programs"]
    if said:
        for key in ("loaded", "compiled", "backend_compiled"):
            entry[key] = [str(name) for r in said for name in r.get(key) or []]
        counts = [r["backend_compiles"] for r in said if isinstance(r.get("backend_compiles"), int)]
        if counts:
            entry["backend_compiles"] = sum(counts)
    return entry


def fault_breakdown(
    fault: dict[str, Any], by_host: dict[int, list[dict[str, Any]]], started_at: float
) -> Any:
    """The fault's breakdown: per host, and per part the slowest host; None without a detection."""
    fired, detected = number(fault.get("fired_at")), number(fault.get("detected_at"))
    if fired is None or detected is None:
        return None
    hosts = []
    for host, records in sorted(by_host.items()):
        parts = _host_parts(records, started_at + fired, started_at + detected)
        if parts is not None:
            hosts.append({"host": host, **parts})
    slowest = {}
    for part in (*PARTS, "total"):
        timed = [(h[part], h["host"]) for h in hosts if h.get(part) is not None]
        if timed:
            seconds, host = max(timed)
            slowest[part] = {"seconds": seconds, "host": host}
    return {"hosts": hosts, "slowest": slowest}


def add_breakdowns(report: dict[str, Any], run_dir: Path | str | None = None) -> None:
    """Give each fault of the report its `breakdown`, from the run's event logs."""
    by_host = host_records(report, run_dir)
    started_at = number(report.get("started_at")) or 0.0
    for fault in report.get("faults", []):
        fault["breakdown"] = fault_breakdown(fault, by_host, started_at)


def compiled_by_host(breakdown: dict[str, Any] | None) -> dict[int, list[str]]:
    """Host -> the programs its restarted workload compiled (hosts that compiled nothing left out)."""
    hosts = (breakdown or {}).get("hosts") or []
    return {int(h["host"]): list(h["compiled"]) for h in hosts if h.get("compiled")}


def breakdown_line(breakdown: dict[str, Any] | None) -> str | None:
    """`detect 0.02 | stop 0.08 | ... | programs 0.26 | ...`: each part's slowest host, then which
    hosts compiled programs again, if any did."""
    if not breakdown or not breakdown.get("slowest"):
        return None
    slowest = breakdown["slowest"]
    line = " | ".join(f"{LABELS[part]} {slowest[part]['seconds']:.2f}" for part in PARTS if part in slowest)
    compiled = compiled_by_host(breakdown)
    if compiled:
        line += "; compiled again: " + ", ".join(
            f"host {host} ({', '.join(names)})" for host, names in sorted(compiled.items())
        )
    return line
