"""Replay: the decisions a policy would take on a recorded event log, without running anything.

The job's leader appends one JSON line per decision to `policy-events.jsonl` (next to the report):
the event, the context it was decided in (without the history, which is the log's earlier lines)
and the decision. `slicekeeper policy replay EVENTS --policy FILE` asks another policy about each
recorded event in its recorded context and prints both answers side by side: a dry run before a
new policy is trusted. Replay does not simulate what a different answer would have changed: each
event is judged against the context as it was recorded.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from slicekeeper.errors import UserError
from slicekeeper.policy import Context, Decision, DecisionSource, Event, Fail
from slicekeeper.policy.engine import PolicyEngine

EVENT_LOG_NAME = "policy-events.jsonl"
"""The file the leader writes next to the report."""

Record = tuple[Event, Context, Decision]


def log_record(decision: Decision, context: Context) -> dict[str, Any]:
    """One line of the event log: the event, its context (history as a count) and the decision."""
    return {
        "event": decision.event.to_json(),
        "context": context.to_json(with_history=False),
        "decision": decision.to_json(with_event=False),
    }


def append_to_log(path: Path, decision: Decision, context: Context) -> None:
    """Append one decision to the event log (one line, flushed: a crash keeps the earlier lines)."""
    with path.open("a", encoding="utf-8") as log:
        log.write(json.dumps(log_record(decision, context)) + "\n")


def read_log(path: str | Path) -> list[Record]:
    """The records of an event log; each context gets back its history from the earlier lines."""
    file = Path(path)
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise UserError(f"{file}: cannot read the event log: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise UserError(f"{file}: not a text file (expected {EVENT_LOG_NAME} lines of JSON)") from None
    records: list[Record] = []
    decisions: list[Decision] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as error:
            raise UserError(f"{file}:{number}: not valid JSON: {error.msg}") from None
        try:
            record = _record(data, decisions)
        except ValueError as error:
            raise UserError(f"{file}:{number}: not a policy decision record: {error}") from None
        records.append(record)
        decisions.append(record[2])
    return records


def _record(data: Any, earlier: list[Decision]) -> Record:
    if not isinstance(data, dict) or not {"event", "context", "decision"} <= data.keys():
        raise ValueError("expected an object with event, context and decision")
    event = Event.from_json(data["event"])
    raw_context = data["context"]
    history = None  # a context written with its history keeps it
    if isinstance(raw_context, dict) and "history" not in raw_context:
        length = raw_context.pop("history_length", len(earlier))
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise ValueError(f"context.history_length: expected a count, found {length!r}")
        # A log that starts mid-run holds fewer earlier decisions than were made: replay has those only.
        history = earlier[len(earlier) - min(length, len(earlier)) :]
    context = Context.from_json(raw_context, history=history)
    return event, context, Decision.from_json(data["decision"], event=event)


def replay(records: Iterable[Record], engine: PolicyEngine) -> list[tuple[Decision, Decision]]:
    """Each recorded decision with the one `engine` takes on the same event in the same context."""
    return [(recorded, engine.evaluate(event, context)) for event, context, recorded in records]


def _action(decision: Decision) -> str:
    return f"{decision.action!r} [{decision.source}]"


def format_replay(pairs: Sequence[tuple[Decision, Decision]], *, policy: str) -> str:
    """A table: time and step, the event, recorded and replayed action, `*` where they differ."""
    if not pairs:
        return "no decisions recorded in the event log\n"
    start = pairs[0][0].t
    rows = [("t", "step", "event", "recorded", f"replayed ({policy})", "")]
    notes: dict[int, str] = {}
    for index, (recorded, replayed) in enumerate(pairs):
        differs = recorded.action != replayed.action
        rows.append(
            (
                f"+{recorded.t - start:.1f}s",
                str(recorded.event.step),
                recorded.event.summary,
                _action(recorded),
                _action(replayed),
                "*" if differs else "",
            )
        )
        if replayed.source is DecisionSource.FALLBACK:
            notes[index + 1] = replayed.reason
        elif isinstance(replayed.action, Fail):
            notes[index + 1] = replayed.action.reason
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
        if index in notes:
            lines.append(f"    replayed: {notes[index]}")
    differing = sum(1 for recorded, replayed in pairs if recorded.action != replayed.action)
    lines.append(f"{differing} of {len(pairs)} decision(s) differ")
    return "\n".join(lines) + "\n"
