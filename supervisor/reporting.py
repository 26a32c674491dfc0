"""How a host's parts say what happened: to the job's leader (`Report`) and to the host's event log
(`Log`, written to the machine's `EventLog`). The host supervisor owns both ends (its membership, its
event log) and hands the parts these callables; the checkpoint tiers and the host's parts alike take
them."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from slicekeeper.supervisor import messages

from slicekeeper.goodput import Category

Report = Callable[[messages.MemberReport], Awaitable[None]]
"""Sends a report to the leader (the supervisor stamps the host it serves)."""

Log = Callable[[dict[str, Any]], None]
"""Appends a record (what happened; the time is added) to the host's event log."""


class EventLog:
    """A machine's event log, `events.jsonl` in its folder: what happened, when, one JSON object a
    line, for post-mortems, replay and the run's page."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("a", buffering=1)

    def log(self, record: dict[str, Any]) -> None:
        """Appended with the time (a `Log`)."""
        self._file.write(json.dumps({"t": time.time(), **record}) + "\n")

    def booked(self, category: Category, start: float, end: float) -> None:
        """An interval of the host's time, closed and booked (slicekeeper.goodput.Booked). Dropped once
        the log is closed (the account was written)."""
        if not self._file.closed:
            self.log(
                {
                    "source": "goodput",
                    "type": "interval",
                    "category": category.value,
                    "start": start,
                    "end": end,
                }
            )

    def close(self) -> None:
        self._file.close()
