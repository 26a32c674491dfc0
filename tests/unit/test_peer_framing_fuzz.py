"""Hostile input on the peer tier's framing: a replica server drops a bad request and serves the next.

A real ReplicaServer serves on 127.0.0.1 and a hostile peer sends it a request: header lines of any
shape (not JSON, the wrong types, huge or negative counts, deep nesting), manifests that announce
more or fewer bytes than they have or describe impossible files, file bytes cut short or wrong, and
senders that trickle or stop in the middle of a frame. The properties: nothing raises out of the
request's handler (the event loop's exception handler never hears of one), the connection is closed
within the server's idle timeout, nothing is committed unless the request was a well-formed push
(then what is committed matches its manifest), no temporary folder is left, and a well-formed push
and fetch work right after. And the other way round: a fetch from a hostile holder
fails with a ReplicationError and commits nothing (or, for a well-formed reply, commits what
matches its manifest).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from slicekeeper.supervisor.checkpoints.peer_tier import (
    MAX_MANIFEST_BYTES,
    ReplicaServer,
    ReplicaStore,
    ReplicationError,
    fetch_replica,
    push_replica,
)

from slicekeeper import shard_folder
from slicekeeper.shard_folder import Manifest, ShardFile

pytestmark = pytest.mark.timeout(120)

OWNER = 3
IDLE = 0.3
"""The server's idle timeout in these tests: a stalled sender is dropped after this long."""
DATA = b"abcd"
SHA = hashlib.sha256(DATA).hexdigest()
GOOD_MANIFEST = Manifest(7, (ShardFile("a", "00000.bin", SHA, len(DATA)),)).to_json().encode()

HOSTILE_NUMBERS = st.sampled_from(
    [10**100, -(10**100), 2**63, 2**64, -1, math.nan, math.inf, -math.inf, 1e308, True, MAX_MANIFEST_BYTES]
)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-1, 8), st.integers(), HOSTILE_NUMBERS, st.text(max_size=8)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def line_of(value: Any) -> bytes:
    return json.dumps(value).encode() + b"\n"


def nested(depth: int) -> bytes:
    return b'{"op": "push", "owner": 3, "step": 7, "manifest": ' + b"[" * depth + b"]" * depth + b"}\n"


def nested_manifest(depth: int) -> bytes:
    return b'{"step": 7, "shards": ' + b"[" * depth + b"]" * depth + b"}"


INFINITE_SIZE = b'{"step": 7, "shards": {"a": {"file": "00000.bin", "sha256": "0", "size": Infinity}}}'


def push_of(manifest: bytes) -> bytes:
    return line_of({"op": "push", "owner": OWNER, "step": 7, "manifest": len(manifest)}) + manifest


def fetched(manifest: bytes) -> bytes:
    return line_of({"ok": True, "manifest": len(manifest)}) + manifest


HEADERS = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "op": st.sampled_from(["push", "fetch"]) | JSON,
            "owner": st.just(OWNER) | JSON,
            "step": st.just(7) | JSON,
            "manifest": st.integers(0, 400) | JSON,
        },
    ).map(line_of),
    JSON.map(line_of),
    st.binary(max_size=40),  # no newline, or several
    st.integers(500, 30_000).map(nested),
)
SHARD_ENTRIES = st.fixed_dictionaries(
    {},
    optional={
        "file": st.sampled_from(["00000.bin", "..", "a/b", "", "manifest.json", "x\x00y", "f" * 300]) | JSON,
        "sha256": st.just(SHA) | JSON,
        "size": st.sampled_from([4, 0, -1, 2**62, math.inf, math.nan, 1e300]) | JSON,
    },
)
MANIFESTS = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "step": st.just(7) | JSON,
            "shards": st.dictionaries(st.text(max_size=4), SHARD_ENTRIES, max_size=3) | JSON,
        },
    ).map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=60),
    st.integers(500, 30_000).map(nested_manifest),
)


@st.composite
def push_requests(draw: st.DrawFn) -> bytes:
    """A push header announcing a manifest (its true length, or another), the manifest, some bytes."""
    manifest = draw(MANIFESTS)
    announced = draw(st.just(len(manifest)) | st.integers(0, 2 * len(manifest) + 8) | HOSTILE_NUMBERS)
    header = line_of({"op": "push", "owner": OWNER, "step": 7, "manifest": announced})
    return header + manifest + draw(st.binary(max_size=16))


REQUESTS = st.one_of(
    push_requests(),
    st.lists(HEADERS, min_size=1, max_size=3).map(b"".join),
    st.binary(max_size=80),
)


class LoopErrors:
    """What reached the event loop's exception handler: an exception out of a request's handler."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, context: self.seen.append(context))


def committed_folder(directory: Path, step: int) -> Path:
    """A committed shard folder holding one file, DATA."""
    tmp = shard_folder.tmp_dir(directory, step)
    tmp.mkdir(parents=True)
    (tmp / "00000.bin").write_bytes(DATA)
    shard_folder.write_manifest(tmp, Manifest(step, (ShardFile("a", "00000.bin", SHA, len(DATA)),)))
    shard_folder.commit(tmp, shard_folder.step_dir(directory, step))
    return shard_folder.step_dir(directory, step)


def leftovers(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.tmp")) if directory.exists() else []


@asynccontextmanager
async def serving(store: ReplicaStore) -> AsyncIterator[str]:
    server = ReplicaServer(store, idle_timeout=IDLE)
    port = await server.serve("127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.close()


async def answer_to(address: str, request: bytes) -> bytes:
    """Send `request` and end the sending side; what the server answers until it closes (nothing when
    it closes with part of the request unread: the connection is reset)."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        writer.write_eof()
        return await asyncio.wait_for(reader.read(), 4 * IDLE)  # closed by the server, at the latest idle
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


async def a_push_and_fetch_work(address: str, scratch: Path) -> None:
    await push_replica(address, OWNER, committed_folder(scratch / "local", 9))
    await fetch_replica(address, OWNER, 9, scratch / "restored")
    assert (shard_folder.step_dir(scratch / "restored", 9) / "00000.bin").read_bytes() == DATA


# --- the server -------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=REQUESTS)
@example(request=nested(2000))  # found: RecursionError out of the header's json.loads
@example(request=push_of(nested_manifest(2000)))  # found: RecursionError out of Manifest.from_json
@example(request=push_of(INFINITE_SIZE))  # found: OverflowError (int(inf)) out of Manifest.from_json
def test_a_hostile_request_is_dropped_commits_nothing_and_the_server_keeps_serving(tmp_path_factory, request):
    scratch = tmp_path_factory.mktemp("peer")
    store = ReplicaStore(scratch / "replicas", keep=2)

    async def scenario() -> None:
        errors = LoopErrors()
        async with serving(store) as address:
            answer = await answer_to(address, request)
            if answer.endswith(b'{"ok": true}\n{"ok": true}\n'):  # a well-formed push after all
                assert store.inventory() == {OWNER: [7]}
                shard_folder.verify(store.folder(OWNER, 7))
            else:
                assert answer == b"" or json.loads(answer.splitlines()[-1])["ok"] is False
                assert store.inventory() == {}
            await a_push_and_fetch_work(address, scratch)
        assert leftovers(scratch) == []
        assert errors.seen == []

    asyncio.run(scenario())


PUSH_HEADER = line_of({"op": "push", "owner": OWNER, "step": 7, "manifest": len(GOOD_MANIFEST)})


@pytest.mark.parametrize(
    ("whole", "trickled"),
    [
        (b"", PUSH_HEADER),
        (PUSH_HEADER, GOOD_MANIFEST),
        (PUSH_HEADER + GOOD_MANIFEST, DATA),
        (PUSH_HEADER + GOOD_MANIFEST + DATA[:2], b""),
    ],
    ids=["header", "manifest", "file", "stopped in a file"],
)
def test_a_sender_that_trickles_or_stops_in_the_middle_of_a_frame_is_dropped_after_the_idle_timeout(
    tmp_path, whole, trickled
):
    store = ReplicaStore(tmp_path / "replicas", keep=2)

    async def scenario() -> None:
        errors = LoopErrors()
        async with serving(store) as address:
            reader, writer = await asyncio.open_connection(*address.split(":"))
            started = asyncio.get_running_loop().time()
            writer.write(whole)
            with contextlib.suppress(ConnectionError):
                for byte in trickled:  # a byte every IDLE / 4: every read waits less than IDLE
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(IDLE / 4)
                    if reader.at_eof():
                        break
                await asyncio.wait_for(reader.read(), 4 * IDLE)  # the server ends the connection
            assert asyncio.get_running_loop().time() - started < (len(trickled) / 4 + 4) * IDLE
            writer.close()
            await asyncio.sleep(0.05)
            assert leftovers(store.directory) == []
            await a_push_and_fetch_work(address, tmp_path)
        assert errors.seen == []

    asyncio.run(scenario())


def test_a_header_line_over_the_limit_is_refused_and_its_connection_dropped(tmp_path):
    store = ReplicaStore(tmp_path / "replicas", keep=2)

    async def scenario() -> None:
        errors = LoopErrors()
        async with serving(store) as address:
            await answer_to(address, b'{"op": "fetch", "owner": "' + b"x" * (1 << 20) + b'"}\n')
            await a_push_and_fetch_work(address, tmp_path)
        assert errors.seen == []

    asyncio.run(scenario())


# --- the client -------------------------------------------------------------------------------------


@st.composite
def fetch_replies(draw: st.DrawFn) -> bytes:
    """A holder's answer to a fetch: `ok` announcing a manifest (its true length, or another), the
    manifest, some bytes."""
    manifest = draw(MANIFESTS)
    announced = draw(st.just(len(manifest)) | HOSTILE_NUMBERS)
    return line_of({"ok": True, "manifest": announced}) + manifest + draw(st.binary(max_size=8))


@settings(max_examples=80, deadline=None)
@given(reply=st.one_of(st.binary(max_size=60), HEADERS, fetch_replies()))
@example(reply=nested(2000))
@example(reply=fetched(nested_manifest(2000)))
@example(reply=fetched(INFINITE_SIZE))
def test_a_fetch_from_a_hostile_holder_fails_with_a_replication_error_or_commits_what_matches_its_manifest(
    tmp_path_factory, reply
):
    scratch = tmp_path_factory.mktemp("fetch")

    async def holder(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(reply)
        await writer.drain()
        writer.close()

    async def scenario() -> None:
        errors = LoopErrors()
        server = await asyncio.start_server(holder, "127.0.0.1", 0)
        address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            await fetch_replica(address, OWNER, 7, scratch / "restored", timeout=2.0)
        except ReplicationError:
            assert shard_folder.committed_steps(scratch / "restored") == []
        else:  # a well-formed reply after all: what is committed matches its manifest
            shard_folder.verify(shard_folder.step_dir(scratch / "restored", 7))
        server.close()
        assert errors.seen == []

    asyncio.run(scenario())
    assert leftovers(scratch) == []
