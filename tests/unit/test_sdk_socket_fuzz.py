"""Hostile input on the SDK's socket: whatever a workload sends, its supervisor keeps listening.

A real SdkEvents serves its Unix socket and a hostile workload sends it lines: bytes that are no JSON,
JSON of the wrong shape, events of every type with fields of the wrong type (lists, nulls, strings,
huge integers, NaN, deep nesting), and well-formed events in any order. The properties: nothing raises
out of the connection's handler (the event loop's exception handler never hears of one), a malformed
line is ignored and its connection read on, what the supervisor forwards to its leader is always a
report the leader accepts, no metric grows a label per value a workload makes up; a line over
`protocol.SDK_LINE_LIMIT` ends its connection and the server serves the next. The socket is the job's
user's alone (mode 0600).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoint_vocabulary import Tier
from slicekeeper.supervisor.host.detectors import finished_message
from slicekeeper.supervisor.host.sdk_events import SdkEvents
from slicekeeper.supervisor.host.workload import Standby
from slicekeeper.supervisor.metrics import SupervisorMetrics
from slicekeeper.supervisor.signals.culprit import ActivityTracker
from slicekeeper.supervisor.signals.hang import HangDetector

from slicekeeper import protocol
from slicekeeper.api_spec import HealthSpec
from slicekeeper.goodput import GoodputAccountant
from slicekeeper.protocol import Event, Phase
from tests.support.host_contexts import host_context

pytestmark = pytest.mark.timeout(120)

WAIT = 5.0
MARK = 424_242
"""The step of the well-formed events sent after the hostile ones."""
FIELDS = [
    "step",
    "loss",
    "work",
    "phase",
    "tier",
    "reason",
    "during",
    "fingerprint",
    "pid",
    "standby",
    "t",
    "loaded",
    "compiled",
]

HOSTILE_NUMBERS = st.sampled_from(
    [10**100, -(10**100), 2**63, 2**64, -1, math.nan, math.inf, -math.inf, 1e308, -0.0, True]
)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-1, 5), st.integers(), HOSTILE_NUMBERS, st.floats(), st.text()
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "step": st.integers(0, 12),
    "loss": st.floats(0, 10),
    "work": st.floats(0, 1),
    "phase": st.sampled_from([phase.value for phase in Phase]),
    "tier": st.sampled_from(["local", "peer", "persistent"]) | st.text(max_size=12),
    "during": st.sampled_from(["save", "restore"]),
}


def line_of(value: Any) -> bytes:
    return json.dumps(value).encode() + b"\n"


def one_line(raw: bytes) -> bytes:
    return raw.replace(b"\n", b"") + b"\n"


def nested(depth: int) -> bytes:
    return b'{"type": "step_end", "step": 1, "loss": ' + b"[" * depth + b"]" * depth + b"}\n"


@st.composite
def event_shaped(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from([event.value for event in Event]) | JSON)
    body = draw(
        st.fixed_dictionaries({}, optional={name: PLAUSIBLE.get(name, JSON) | JSON for name in FIELDS})
    )
    return line_of({"type": kind, **body})


HOSTILE_LINES = st.one_of(
    event_shaped(),
    JSON.map(line_of),
    st.binary(max_size=64).map(one_line),
    st.integers(500, 20_000).map(nested),
)


class LoopErrors:
    """What reached the event loop's exception handler: an exception out of a connection's handler."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, context: self.seen.append(context))


class FakeProcess:
    # Equal to nothing a JSON line decodes to, so no hostile hello is this standby's: every connection
    # is read as the generation's workload. (A pid a line can name, -1 once, made a generated hello
    # a real standby's, whose connection then rightly waited for a promotion that never came.)
    pid = object()

    async def wait(self) -> int:
        await asyncio.sleep(3600)
        return 0


class Supervisor:
    """The parts of a host's supervisor the SDK's events reach, each real, its leader a list."""

    def __init__(self, standby: bool) -> None:
        self.accountant = GoodputAccountant(time.time())
        self.metrics = SupervisorMetrics(lambda: self.accountant)
        self.reports: list[messages.MemberReport] = []
        self.said: list[str] = []
        waiting = Standby(FakeProcess()) if standby else None  # type: ignore[arg-type]
        context = host_context(
            accountant=self.accountant,
            metrics=self.metrics,
            report=self.report,
            log=lambda record: json.dumps(record),
            say=self.said.append,
        )
        self.sdk = SdkEvents(
            context,
            detector=HangDetector(HealthSpec()),
            activity=ActivityTracker(),
            checkpoint_saved=lambda step: None,
            standby=lambda: waiting,
            step_begun=lambda step: None,
            productive_again=lambda: None,
        )
        self.sdk.begin(0, None, time.time(), host_count=1)

    async def report(self, message: messages.MemberReport) -> None:
        self.reports.append(message)

    def as_the_leader_reads_it(self, report: messages.MemberReport) -> messages.ToLeader:
        return messages.to_leader(report.model_copy(update={"host": 0}).encode())

    async def marked_step_arrived(self) -> None:
        async with asyncio.timeout(WAIT):
            while not any(isinstance(r, messages.Progress) and r.step == MARK for r in self.reports):
                await asyncio.sleep(0.005)


@asynccontextmanager
async def serving(supervisor: Supervisor, path: Path) -> AsyncIterator[Path]:
    server = await supervisor.sdk.serve(path)
    try:
        yield path
    finally:
        server.close()


def socket_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sdk") / "sdk.sock"


def run_in(scenario: Callable[[Path], Awaitable[None]]) -> None:
    """Run `scenario` with a socket path in a fresh directory."""
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(scenario(Path(directory) / "sdk.sock"))


# --- properties -------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(HOSTILE_LINES, min_size=1, max_size=8), standby=st.booleans())
@example(lines=[b"not json\n"], standby=True)  # found: the hello check let the ValueError out
@example(lines=[b'{"type": "step_begin", "step": Infinity}\n'], standby=False)  # found: OverflowError
@example(lines=[line_of({"type": "step_end", "step": 1, "loss": [1]})], standby=False)  # found: forwarded
@example(lines=[line_of({"type": "done", "fingerprint": "f"})], standby=False)  # found: KeyError at exit
@example(lines=[nested(2000)], standby=False)
@example(lines=[line_of({"type": "hello", "standby": 1, "pid": -1})], standby=True)  # found: see FakeProcess
def test_malformed_events_are_ignored_the_connection_read_on_and_only_valid_reports_forwarded(
    tmp_path_factory, lines, standby
):
    path = socket_path(tmp_path_factory)

    async def scenario() -> None:
        errors = LoopErrors()
        supervisor = Supervisor(standby)
        async with serving(supervisor, path):
            _, writer = await asyncio.open_unix_connection(str(path))
            for line in lines:
                writer.write(line)
            writer.write(line_of({"type": "step_begin", "step": MARK}))
            writer.write(line_of({"type": "step_end", "step": MARK, "loss": 1.0}))
            await writer.drain()
            await supervisor.marked_step_arrived()
            writer.close()
        for report in supervisor.reports:
            supervisor.as_the_leader_reads_it(report)
        if supervisor.sdk.done is not None:
            supervisor.as_the_leader_reads_it(finished_message(0, supervisor.sdk.done))
        generate_latest(supervisor.metrics.registry)  # every metric still renders
        assert errors.seen == []

    asyncio.run(scenario())


def test_a_workload_naming_ever_new_tiers_adds_no_metric_label_beyond_the_tiers():
    async def scenario(path: Path) -> None:
        supervisor = Supervisor(standby=False)
        async with serving(supervisor, path):
            _, writer = await asyncio.open_unix_connection(str(path))
            for n in range(200):
                writer.write(line_of({"type": "checkpoint_failed", "step": 1, "tier": f"tier-{n}"}))
            writer.write(line_of({"type": "step_begin", "step": MARK}))
            writer.write(line_of({"type": "step_end", "step": MARK}))
            await writer.drain()
            await supervisor.marked_step_arrived()
            writer.close()
        failures = supervisor.metrics.registry.get_sample_value
        labels = {
            sample.labels["tier"]
            for metric in supervisor.metrics.checkpoint_failures.collect()
            for sample in metric.samples
        }
        assert labels <= {tier.value for tier in Tier}
        assert sum(failures("slicekeeper_checkpoint_failures_total", {"tier": t}) or 0 for t in labels) == 200

    run_in(scenario)


# --- size and time limits ---------------------------------------------------------------------------


def test_a_line_over_the_limit_ends_its_connection_and_the_server_serves_the_next():
    async def scenario(path: Path) -> None:
        errors = LoopErrors()
        supervisor = Supervisor(standby=False)
        async with serving(supervisor, path):
            reader, writer = await asyncio.open_unix_connection(str(path))
            fingerprint = b"f" * protocol.SDK_LINE_LIMIT
            writer.write(b'{"type": "done", "step": 1, "fingerprint": "' + fingerprint + b'"}\n')
            try:
                await writer.drain()
                assert await asyncio.wait_for(reader.read(), WAIT) == b""  # dropped
            except ConnectionError:
                pass  # dropped while still writing
            assert supervisor.sdk.done is None
            assert any("limit" in text for text in supervisor.said)
            _, writer = await asyncio.open_unix_connection(str(path))
            writer.write(line_of({"type": "step_begin", "step": MARK}))
            writer.write(line_of({"type": "step_end", "step": MARK}))
            await writer.drain()
            await supervisor.marked_step_arrived()
            writer.close()
        assert errors.seen == []

    run_in(scenario)


def test_a_workload_that_stops_in_the_middle_of_a_line_holds_only_its_own_connection():
    """No read timeout on the SDK's socket: a workload is silent for long stretches (compiling, a long
    step), and the hang detector, not the socket, decides when silence is a fault."""

    async def scenario(path: Path) -> None:
        errors = LoopErrors()
        supervisor = Supervisor(standby=False)
        async with serving(supervisor, path):
            _, slow = await asyncio.open_unix_connection(str(path))
            slow.write(b'{"type": "checkpoint_saved", "st')
            await slow.drain()
            _, writer = await asyncio.open_unix_connection(str(path))
            writer.write(line_of({"type": "step_begin", "step": MARK}))
            writer.write(line_of({"type": "step_end", "step": MARK}))
            await writer.drain()
            await supervisor.marked_step_arrived()
            slow.write(b'ep": 7}\n')  # the rest, later: the line counts whole
            await slow.drain()
            async with asyncio.timeout(WAIT):
                while supervisor.sdk.last_checkpoint != 7:
                    await asyncio.sleep(0.005)
            slow.close()
            writer.close()
        assert errors.seen == []

    run_in(scenario)


# --- who may connect --------------------------------------------------------------------------------


def test_the_socket_is_readable_and_writable_by_the_jobs_user_alone_whatever_the_umask():
    async def scenario(path: Path) -> None:
        supervisor = Supervisor(standby=False)
        async with serving(supervisor, path):
            assert stat.S_ISSOCK(path.stat().st_mode)
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert path.stat().st_uid == os.getuid()

    saved = os.umask(0)  # the most permissive: the mode must not come from it
    try:
        run_in(scenario)
    finally:
        os.umask(saved)
