"""The hosts' event logs of a local run, read host by host.

Each machine's supervisor appends to `<run_dir>/<machine>/events.jsonl`: its own records, the leader's
messages to it and its workload's SDK events, each with its Unix time `t`. A host identity was served
by the machines the report names for it (a spare's records count from the `assign` that made it the
host). The run's page (slicekeeper.report_page) draws these records; the report's recovery breakdown
(slicekeeper.recovery_breakdown) measures them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_MACHINE_NAME = re.compile(r"(host|spare)-[0-9]+")
"""What a machine folder is called (slicekeeper.api's local layout); any other name is not read."""


def records(path: Path) -> Iterator[dict[str, Any]]:
    """The event log's records; a torn line (a writer killed mid-line) is skipped."""
    try:
        lines = path.open(encoding="utf-8", errors="replace")
    except OSError:
        return
    with lines:
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record


def number(value: Any) -> float | None:
    """A finite number, or None (a record written by anything may hold anything)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def host_records(
    report: dict[str, Any], run_dir: Path | str | None = None
) -> dict[int, list[dict[str, Any]]]:
    """Each host's records, from every machine that served it, in the order they were written."""
    where = run_dir or report.get("run_dir")
    by_host: dict[int, list[dict[str, Any]]] = {}
    for host in report.get("hosts", []):
        index = int(host["host"])
        kept = by_host.setdefault(index, [])
        if not where:
            continue
        for machine in dict.fromkeys(host.get("machines") or [f"host-{index}"]):
            if not isinstance(machine, str) or not _MACHINE_NAME.fullmatch(machine):
                continue
            serving: int | None = int(machine.split("-")[1]) if machine.startswith("host-") else None
            for record in records(Path(where) / machine / "events.jsonl"):
                if record.get("type") == "assign":
                    serving = record.get("host")
                elif serving == index:
                    kept.append(record)
    return by_host
