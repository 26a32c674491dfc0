"""Hostile input on the leader's wire: whatever a connection sends, the leader keeps serving.

A real Leader serves on 127.0.0.1 and a hostile peer sends it lines: bytes that are no JSON, JSON of
the wrong shape (lists, numbers, nulls, huge integers, NaN, deep nesting), messages of every type
with fields of the wrong type or out of range, and well-formed messages in any order. The
properties: nothing raises out of the connection's handler (the event loop's exception handler
never hears of one), a malformed line is ignored and its connection carries on, every other
connection is served; a line over `protocol.CONTROL_LINE_LIMIT` ends its connection, and a line cut
short by the connection's end is not acted on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, get_args

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader import Leader
from slicekeeper.supervisor.leader.restart_state import JobState
from slicekeeper.supervisor.leader.settings import LeaderSettings

from slicekeeper import protocol
from slicekeeper.shape import JobShape
from tests.support.fake_members import WAIT, coordinator, eventually

pytestmark = pytest.mark.timeout(120)

HOSTS = 2
FIELDS: dict[str, list[str]] = {
    model.model_fields["type"].default: list(model.model_fields) for model in get_args(messages.ToLeader)
}
"""Each message type a leader reads -> the fields it carries."""
FIELD_NAMES = sorted({name for names in FIELDS.values() for name in names})

HOSTILE_NUMBERS = st.sampled_from(
    [10**100, -(10**100), 2**63, 2**64, -1, math.nan, math.inf, -math.inf, 1e308, -0.0, True]
)
SCALARS = (
    st.none() | st.booleans() | st.integers(-2, 3) | st.integers() | HOSTILE_NUMBERS | st.floats() | st.text()
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=6) | st.sampled_from(FIELD_NAMES), inner, max_size=3)
    ),
    max_leaves=8,
)
"""Any JSON value (NaN and the infinities included: Python's json reads them)."""

PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "host": st.integers(-1, HOSTS),
    "spare": st.integers(-1, 1),
    "generation": st.integers(-1, 2),
    "step": st.integers(-1, 12),
    "t": st.floats(0, 200) | HOSTILE_NUMBERS,
    "kind": st.sampled_from(["crash", "hang", "kill", "lose", "slow", "nonfinite_loss"]),
    "tier": st.sampled_from(["local", "peer", "persistent"]),
    "committed": st.lists(st.integers(-1, 12), max_size=3),
    "replicas": st.dictionaries(st.integers(-1, HOSTS).map(str), st.lists(st.integers(0, 12), max_size=2)),
    "state": st.sampled_from(["training", "stopped", "lost"]),
}
"""Values that pass validation often enough for the message to reach the leader's state machine."""


@st.composite
def message_shaped(draw: st.DrawFn) -> bytes:
    """A JSON object naming a message type (known or not) with some of its fields, any values."""
    kind = draw(st.sampled_from(sorted(FIELDS)) | JSON)
    names = FIELDS.get(kind, []) if isinstance(kind, str) else []
    body = draw(
        st.fixed_dictionaries(
            {}, optional={name: PLAUSIBLE.get(name, JSON) | JSON for name in names if name != "type"}
        )
    )
    return json.dumps({"type": kind, **body}).encode() + b"\n"


def nested(depth: int) -> bytes:
    inner = b"[" * depth + b"]" * depth
    return b'{"type": "register", "host": 0, "journal": {"seq": 1, "journal": {"a": ' + inner + b"}}}\n"


def unclosed(depth: int) -> bytes:
    return b"[" * depth + b"\n"


def long_integer(digits: int) -> bytes:
    return b'{"type": "progress", "host": 0, "generation": 0, "step": ' + b"9" * digits + b"}\n"


def one_line(raw: bytes) -> bytes:
    return raw.replace(b"\n", b"") + b"\n"


def line_of(value: Any) -> bytes:
    return json.dumps(value).encode() + b"\n"


HOSTILE_LINES = st.one_of(
    message_shaped(),
    JSON.map(line_of),
    st.binary(max_size=64).map(one_line),
    st.integers(500, 100_000).map(nested),
    st.integers(500, 100_000).map(unclosed),
    st.integers(4300, 6000).map(long_integer),
    st.just(b'{"type": "progress", "host": 0, "generation": 0, "step": 1, "t": NaN, "work": Infinity}\n'),
)


class LoopErrors:
    """What reached the event loop's exception handler: an exception out of a connection's handler."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, context: self.seen.append(context))


@asynccontextmanager
async def serving(hosts: int = HOSTS) -> AsyncIterator[tuple[Leader, int]]:
    leader = Leader(LeaderSettings(JobShape(1, hosts), 3), coordinator)
    port = await leader.serve("127.0.0.1", 0)
    try:
        yield leader, port
    finally:
        await leader.close()


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, limit=protocol.CONTROL_LINE_LIMIT)


def watches(lines: list[bytes]) -> int:
    """How many of `lines` the leader reads as a `watch` (each is answered with a status)."""
    count = 0
    for line in lines:
        with contextlib.suppress(ValueError):
            count += isinstance(messages.to_leader(line), messages.Watch)
    return count


async def statuses(reader: asyncio.StreamReader, count: int) -> None:
    """Read on until `count` status lines arrived (the leader's other lines to a member skipped)."""
    async with asyncio.timeout(WAIT):
        while count:
            line = await reader.readline()
            assert line.endswith(b"\n"), "the leader ended a connection over a malformed line"
            count -= protocol.decode(line)["type"] == "status"


async def a_watcher_is_served(port: int) -> None:
    reader, writer = await connect(port)
    writer.write(messages.Watch().encode())
    await statuses(reader, 1)
    writer.close()


# --- properties -------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(line=HOSTILE_LINES | st.binary(max_size=64))
@example(line=unclosed(2000))
def test_every_reader_of_the_wire_refuses_a_bad_line_with_a_value_error_and_nothing_else(line):
    """The leader, a member and a watcher parse lines with these: each catches ValueError alone."""
    for parse in (messages.to_leader, messages.command, messages.to_watcher):
        with contextlib.suppress(ValueError):
            parse(line)


def test_the_refusal_of_a_huge_line_names_only_its_start_for_the_log():
    for line in (b"[" + b"1," * 500_000 + b"1]\n", b'{"no type": "' + b"x" * 1_000_000 + b'"}\n'):
        with pytest.raises(ValueError) as refusal:
            messages.to_leader(line)
        assert len(repr(refusal.value)) < 300


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(HOSTILE_LINES, min_size=1, max_size=6))
@example(lines=[nested(2000)])  # found: a RecursionError out of json.loads ended the connection
def test_malformed_or_out_of_order_lines_are_ignored_and_the_connection_and_server_carry_on(lines):
    async def scenario() -> None:
        errors = LoopErrors()
        async with serving() as (_, port):
            reader, writer = await connect(port)
            for line in lines:
                writer.write(line)
            writer.write(messages.Watch().encode())  # well-formed, after the hostile lines
            await writer.drain()
            await statuses(reader, watches(lines) + 1)
            await a_watcher_is_served(port)
            writer.close()
        assert errors.seen == []

    asyncio.run(scenario())


WELL_FORMED_REPORTS = st.sampled_from(
    ["register", "progress", "checkpoint", "fault", "stopped", "finished", "persisted"]
).flatmap(
    lambda kind: st.fixed_dictionaries(
        {"type": st.just(kind), "host": st.integers(0, HOSTS - 1), "generation": st.integers(0, 2)},
        optional={"step": st.integers(0, 12), "committed": st.lists(st.integers(0, 12), max_size=2)},
    )
)


@settings(max_examples=60, deadline=None)
@given(reports=st.lists(WELL_FORMED_REPORTS, min_size=1, max_size=12))
def test_well_formed_reports_in_any_order_never_end_a_members_connection(reports):
    async def scenario() -> None:
        errors = LoopErrors()
        async with serving() as (_, port):
            members = [await connect(port) for _ in range(HOSTS)]
            for report in reports:
                members[report["host"]][1].write(protocol.encode({"t": 1.0, "kind": "crash", **report}))
            for reader, writer in members:
                writer.write(messages.Watch().encode())
                await writer.drain()
                await statuses(reader, 1)
            await a_watcher_is_served(port)
            for _, writer in members:
                writer.close()
        assert errors.seen == []

    asyncio.run(scenario())


# --- size and time limits ---------------------------------------------------------------------------


def test_a_line_over_the_limit_ends_only_its_own_connection_and_the_member_counts_as_lost():
    async def scenario() -> None:
        errors = LoopErrors()
        async with serving() as (leader, port):
            members = [await connect(port) for _ in range(HOSTS)]
            for host, (_, writer) in enumerate(members):
                writer.write(messages.Register(host=host).encode())
            for reader, _ in members:
                assert protocol.decode(await reader.readline())["type"] in ("journal", "start")
            reader, writer = members[1]
            state = b"x" * protocol.CONTROL_LINE_LIMIT
            writer.write(b'{"type": "state", "host": 1, "state": "' + state + b'"}\n')
            with contextlib.suppress(ConnectionError):  # closed by the leader while still writing
                await writer.drain()
            async with asyncio.timeout(WAIT):
                while await reader.read(1 << 16):  # the leader's lines to it, then the end
                    pass
            await eventually(lambda: leader.status[1].state == "lost")
            await a_watcher_is_served(port)
            members[0][1].write(messages.Watch().encode())
            await statuses(members[0][0], 1)
        assert errors.seen == []

    asyncio.run(scenario())


def test_a_sender_that_stops_in_the_middle_of_a_line_holds_only_its_own_connection():
    """No read timeout on a member's connection: members are silent for long stretches (a step, a
    checkpoint); what bounds a slow or stalled sender is the line limit, not a clock."""

    async def scenario() -> None:
        errors = LoopErrors()
        async with serving() as (leader, port):
            _, slow = await connect(port)
            for byte in b'{"type": "register", "ho':
                slow.write(bytes([byte]))
                await slow.drain()
            await a_watcher_is_served(port)
            slow.write(b'st": 0}\n')  # the rest of the line, much later: it counts whole
            await eventually(lambda: leader.status[0].state == "registered")
            slow.close()
        assert errors.seen == []

    asyncio.run(scenario())


def test_a_line_cut_short_by_the_end_of_its_connection_is_not_acted_on():
    async def scenario() -> None:
        errors = LoopErrors()
        async with serving(hosts=1) as (leader, port):
            _, writer = await connect(port)
            writer.write(messages.Register(host=0).encode().rstrip(b"\n"))
            await writer.drain()
            writer.close()
            await a_watcher_is_served(port)
            await asyncio.sleep(0.05)
            assert leader.memory.state is JobState.REGISTERING
            assert leader.status[0].state != "registered"
        assert errors.seen == []

    asyncio.run(scenario())
