"""How a host's parts say what happened: to the job's leader (`Report`) and to the host's event log
(`Log`). The host supervisor owns both ends (its membership, its events.jsonl) and hands the parts
these callables; the checkpoint tiers and the host's parts alike take them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from slicekeeper.supervisor import messages

Report = Callable[[messages.MemberReport], Awaitable[None]]
"""Sends a report to the leader (the supervisor stamps the host it serves)."""

Log = Callable[[dict[str, Any]], None]
"""Appends a record (what happened; the time is added) to the host's event log."""
