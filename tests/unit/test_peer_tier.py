"""The peer tier: replica placement, and shard folders pushed to and fetched from peers over TCP."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from slicekeeper.supervisor.checkpoints.peer_tier import (
    ReplicaServer,
    ReplicaStore,
    ReplicationError,
    fetch_replica,
    push_replica,
    replica_holders,
)
from slicekeeper.supervisor.ports import free_port

from slicekeeper import shard_folder
from slicekeeper.shard_folder import CorruptCheckpoint, Manifest, ShardFile
from tests.support.shard_folders import contents, files_of, make_folder

OWNER = 3


def leftovers(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.tmp")) if directory.exists() else []


@asynccontextmanager
async def serving(store: ReplicaStore, idle_timeout: float = 5.0) -> AsyncIterator[str]:
    server = ReplicaServer(store, idle_timeout=idle_timeout)
    port = await server.serve("127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.close()


async def eventually(condition: Callable[[], bool], seconds: float = 2.0) -> None:
    """Wait for the server side of a failed request to finish cleaning up."""
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    assert condition()


async def raw_request(address: str, *parts: bytes, close: bool = True) -> bytes:
    """Send raw bytes to a server, then return whatever it answers until it closes."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    for part in parts:
        writer.write(part)
    await writer.drain()
    if close:
        writer.write_eof()
    answer = await asyncio.wait_for(reader.read(), 2.0)
    writer.close()
    await writer.wait_closed()
    return answer


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 5.0))


@pytest.fixture
def store(tmp_path: Path) -> ReplicaStore:
    return ReplicaStore(tmp_path / "replicas", keep=2)


@pytest.fixture
def local(tmp_path: Path) -> Path:
    return tmp_path / "local"


# Placement


def test_replicas_go_first_to_the_same_worker_on_the_following_slices_then_around_the_ring():
    # 4 slices of 2 hosts: host 1 is slice 0, worker 1; the same worker is 3, 5, 7.
    assert replica_holders(1, host_count=8, hosts_per_slice=2, replicas=5) == [3, 5, 7, 2, 4]
    assert replica_holders(7, host_count=8, hosts_per_slice=2, replicas=4) == [1, 3, 5, 0]


def test_the_owner_never_holds_its_own_replica_and_every_holder_is_distinct_and_stable():
    for owner in range(12):
        holders = replica_holders(owner, host_count=12, hosts_per_slice=4, replicas=20)
        assert owner not in holders
        assert sorted(holders) == sorted(set(range(12)) - {owner})
        assert holders == replica_holders(owner, host_count=12, hosts_per_slice=4, replicas=20)


def test_the_number_of_holders_is_capped_by_the_request_and_by_the_other_hosts():
    assert replica_holders(0, host_count=8, hosts_per_slice=2, replicas=0) == []
    assert len(replica_holders(0, host_count=8, hosts_per_slice=2, replicas=2)) == 2
    assert len(replica_holders(0, host_count=4, hosts_per_slice=2, replicas=9)) == 3
    assert replica_holders(0, host_count=1, hosts_per_slice=1, replicas=2) == []


def test_on_a_single_slice_the_holders_are_the_next_hosts_in_ring_order():
    assert replica_holders(2, host_count=4, hosts_per_slice=4, replicas=2) == [3, 0]
    assert replica_holders(3, host_count=4, hosts_per_slice=4, replicas=3) == [0, 1, 2]


@pytest.mark.parametrize(
    ("owner", "hosts", "per_slice", "replicas"),
    [(4, 4, 2, 1), (-1, 4, 2, 1), (0, 6, 4, 1), (0, 4, 0, 1), (0, 4, 2, -1)],
)
def test_an_impossible_layout_is_rejected(owner, hosts, per_slice, replicas):
    with pytest.raises(ValueError):
        replica_holders(owner, hosts, per_slice, replicas)


# Push and fetch


def test_a_pushed_replica_fetched_back_is_bit_identical(store, local, tmp_path):
    source = make_folder(local, 7, contents(7))

    async def test() -> None:
        async with serving(store) as address:
            pushed = await push_replica(address, OWNER, source)
            assert store.folder(OWNER, 7) == store.directory / "host-3" / "step-00000007"
            fetched = await fetch_replica(address, OWNER, 7, tmp_path / "restored")
        assert pushed.step == fetched.step == 7
        assert pushed.bytes == fetched.bytes == sum(map(len, contents(7).values()))
        assert pushed.seconds > 0 and fetched.seconds > 0

    run(test)
    assert files_of(tmp_path / "restored" / "step-00000007") == files_of(source)
    assert files_of(store.folder(OWNER, 7)) == files_of(source)
    shard_folder.verify(tmp_path / "restored" / "step-00000007")
    assert leftovers(tmp_path) == []


def test_a_replica_pushed_again_replaces_the_held_copy_of_that_step(store, local, tmp_path):
    async def test() -> None:
        async with serving(store) as address:
            await push_replica(address, OWNER, make_folder(local / "a", 5, {"x": b"old"}))
            await push_replica(address, OWNER, make_folder(local / "b", 5, {"x": b"new"}))

    run(test)
    assert store.steps(OWNER) == [5]
    assert (store.folder(OWNER, 5) / "00000.bin").read_bytes() == b"new"


def test_the_store_keeps_the_newest_steps_of_each_owner_separately(store, local):
    async def test() -> None:
        async with serving(store) as address:
            for step in (10, 20, 30, 40):
                await push_replica(address, OWNER, make_folder(local / "3", step, {"a": b"%d" % step}))
            await push_replica(address, 5, make_folder(local / "5", 10, {"a": b"five"}))

    run(test)
    assert store.steps(OWNER) == [30, 40]
    assert store.steps(5) == [10]
    assert not store.folder(OWNER, 10).exists()


def test_the_inventory_lists_committed_steps_of_every_owner_and_skips_unfinished_ones(store, local):
    assert store.inventory() == {}

    async def test() -> None:
        async with serving(store) as address:
            await push_replica(address, 1, make_folder(local / "1", 4, {"a": b"1"}))
            await push_replica(address, 0, make_folder(local / "0", 8, {"a": b"0"}))
            await push_replica(address, 0, make_folder(local / "0", 9, {"a": b"0"}))

    run(test)
    shard_folder.tmp_dir(store.directory / "host-1", 5).mkdir()
    (store.directory / "host-2").mkdir()
    assert store.inventory() == {0: [8, 9], 1: [4]}
    store.quarantine(1, 4)
    assert store.inventory() == {0: [8, 9]}


# Failures


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "delete"])
def test_a_source_that_does_not_match_its_manifest_is_refused_and_nothing_is_committed(store, local, damage):
    source = make_folder(local, 7, contents(7))
    big = source / "00001.bin"
    data = bytearray(big.read_bytes())
    if damage == "flip a byte":
        data[-1] ^= 0xFF
        big.write_bytes(bytes(data))
    elif damage == "truncate":
        big.write_bytes(bytes(data[:-1]))
    else:
        big.unlink()

    async def test() -> None:
        async with serving(store) as address:
            with pytest.raises(CorruptCheckpoint, match=r"00001\.bin"):
                await push_replica(address, OWNER, source)
            await eventually(lambda: leftovers(store.directory) == [])

    run(test)
    assert store.steps(OWNER) == []


def test_fetching_a_step_that_is_not_held_is_an_error_saying_so(store, local, tmp_path):
    async def test() -> None:
        async with serving(store) as address:
            await push_replica(address, OWNER, make_folder(local, 7, {"a": b"x"}))
            with pytest.raises(ReplicationError, match="not held") as raised:
                await fetch_replica(address, OWNER, 8, tmp_path / "restored")
            assert address in str(raised.value) and "step 8" in str(raised.value)
            with pytest.raises(ReplicationError, match="not held"):
                await fetch_replica(address, 4, 7, tmp_path / "restored")

    run(test)
    assert shard_folder.committed_steps(tmp_path / "restored") == []
    assert leftovers(tmp_path) == []


def test_a_replica_corrupted_on_the_holders_disk_is_refused_and_quarantined(store, local, tmp_path):
    source = make_folder(local, 7, contents(7))

    async def test() -> None:
        async with serving(store) as address:
            await push_replica(address, OWNER, source)
            (store.folder(OWNER, 7) / "00000.bin").write_bytes(b"bit rot")
            with pytest.raises(ReplicationError, match="corrupt"):
                await fetch_replica(address, OWNER, 7, tmp_path / "restored")
            with pytest.raises(ReplicationError, match="not held"):
                await fetch_replica(address, OWNER, 7, tmp_path / "restored")

    run(test)
    assert store.steps(OWNER) == []
    assert (store.directory / "host-3" / "step-00000007.corrupt").is_dir()
    assert shard_folder.committed_steps(tmp_path / "restored") == []
    assert leftovers(tmp_path) == []


def test_an_unreachable_peer_is_an_error_naming_its_address(local, tmp_path):
    address = f"127.0.0.1:{free_port()}"
    source = make_folder(local, 7, {"a": b"x"})

    async def test() -> None:
        with pytest.raises(ReplicationError, match=re.escape(address)):
            await push_replica(address, OWNER, source)
        with pytest.raises(ReplicationError, match=re.escape(address)):
            await fetch_replica(address, OWNER, 7, tmp_path / "restored")
        with pytest.raises(ReplicationError, match="not a host:port"):
            await fetch_replica("nowhere", OWNER, 7, tmp_path / "restored")

    run(test)
    assert leftovers(tmp_path) == []


def test_a_peer_that_never_answers_times_out(local, tmp_path):
    async def test() -> None:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()
            writer.close()

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        with pytest.raises(ReplicationError, match="timed out"):
            await fetch_replica(address, OWNER, 7, tmp_path / "restored", timeout=0.2)
        with pytest.raises(ReplicationError, match="timed out"):
            await push_replica(address, OWNER, make_folder(local, 7, {"a": b"x"}), timeout=0.2)
        server.close()

    run(test)
    assert leftovers(tmp_path) == []


def fake_holder(answer: Callable[[bytes], bytes]) -> Callable[..., Awaitable[None]]:
    """A server that answers every fetch with answer(manifest bytes) after a correct header."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        manifest = Manifest(7, (ShardFile("a", "00000.bin", "0" * 64, 4),)).to_json().encode()
        writer.write(json.dumps({"ok": True, "manifest": len(manifest)}).encode() + b"\n" + manifest)
        writer.write(answer(manifest))
        await writer.drain()
        writer.close()

    return handle


@pytest.mark.parametrize(("payload", "reason"), [(b"abcd", "mismatch in transit"), (b"ab", "cut short")])
def test_a_fetch_whose_bytes_are_wrong_or_cut_short_commits_nothing(tmp_path, payload, reason):
    async def test() -> None:
        server = await asyncio.start_server(fake_holder(lambda _: payload), "127.0.0.1", 0)
        address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        with pytest.raises(ReplicationError, match=reason):
            await fetch_replica(address, OWNER, 7, tmp_path / "restored")
        server.close()

    run(test)
    assert shard_folder.committed_steps(tmp_path / "restored") == []
    assert leftovers(tmp_path) == []


def test_a_fetch_from_a_holder_that_stops_mid_transfer_times_out_and_commits_nothing(tmp_path):
    """Half the bytes, then silence, the connection left open (a holder cut off, or hung): the
    fetch's time limit ends it, and nothing of it stays (the restore falls back to the next source)."""

    async def test() -> None:
        stalled = asyncio.Event()

        async def half_then_silence(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readline()
            manifest = Manifest(7, (ShardFile("a", "00000.bin", "0" * 64, 4),)).to_json().encode()
            writer.write(
                json.dumps({"ok": True, "manifest": len(manifest)}).encode() + b"\n" + manifest + b"ab"
            )
            await writer.drain()
            stalled.set()
            await asyncio.sleep(30)

        server = await asyncio.start_server(half_then_silence, "127.0.0.1", 0)
        address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        with pytest.raises(ReplicationError, match=r"timed out after 0\.3 s"):
            await fetch_replica(address, OWNER, 7, tmp_path / "restored", timeout=0.3)
        assert stalled.is_set()
        server.close()

    run(test)
    assert shard_folder.committed_steps(tmp_path / "restored") == []
    assert leftovers(tmp_path) == []


def push_header(manifest: Manifest, owner: int = OWNER) -> bytes:
    text = manifest.to_json().encode()
    header = {"op": "push", "owner": owner, "step": manifest.step, "manifest": len(text)}
    return json.dumps(header).encode() + b"\n" + text


GOOD = Manifest(7, (ShardFile("a", "00000.bin", hashlib.sha256(b"abcd").hexdigest(), 4),))


@pytest.mark.parametrize(
    ("request_bytes", "answer"),
    [
        (b"garbage\n", "bad header"),
        (b'{"op": "push"', ""),  # cut before the end of the header line
        (b'{"op": "delete", "owner": 1, "step": 1}\n', "unknown request"),
        (b'{"op": "fetch", "owner": -1, "step": 1}\n', "not a count"),
        (b'{"op": "push", "owner": 1, "step": 1, "manifest": 999999999999}\n', "too large"),
        (push_header(Manifest(7, (ShardFile("a", "../evil", "0" * 64, 4),))), "invalid file"),
        (push_header(Manifest(8, GOOD.shards), owner=1)[:-3], ""),  # manifest cut short
        (push_header(GOOD) + b"ab", ""),  # file cut short
        (push_header(GOOD) + b"abce", "checksum mismatch"),
    ],
    ids=[
        "not json",
        "header cut short",
        "unknown op",
        "negative owner",
        "huge manifest",
        "file name with ..",
        "manifest cut short",
        "file cut short",
        "bytes not matching the manifest",
    ],
)
def test_a_bad_or_truncated_request_is_refused_and_the_server_keeps_serving(
    store, local, tmp_path, request_bytes, answer
):
    async def test() -> None:
        async with serving(store) as address:
            reply = await raw_request(address, request_bytes)
            if answer:
                assert answer in json.loads(reply.splitlines()[-1])["error"]
            await eventually(lambda: leftovers(store.directory) == [])
            assert store.inventory() == {}
            await push_replica(address, OWNER, make_folder(local, 9, {"a": b"x"}))
            await fetch_replica(address, OWNER, 9, tmp_path / "restored")

    run(test)
    assert store.inventory() == {OWNER: [9]}
    assert not list(tmp_path.rglob("evil"))


def test_a_peer_that_stalls_in_the_middle_of_a_push_is_dropped_and_its_partial_folder_removed(store):
    async def test() -> None:
        async with serving(store, idle_timeout=0.2) as address:
            reply = await raw_request(address, push_header(GOOD) + b"ab", close=False)
            assert b"timed out" in reply
            assert leftovers(store.directory) == []

    run(test)
    assert store.inventory() == {}


def test_closing_the_server_drops_pushes_under_way_without_leaving_a_tmp_folder(store):
    async def test() -> None:
        server = ReplicaServer(store)
        port = await server.serve("127.0.0.1", 0)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(push_header(GOOD) + b"ab")
        await writer.drain()
        await eventually(lambda: leftovers(store.directory) != [])
        await server.close()
        writer.close()

    run(test)
    assert leftovers(store.directory) == []
    assert store.inventory() == {}


def test_a_second_push_of_a_step_still_being_received_is_refused(store, local):
    async def test() -> None:
        async with serving(store) as address:
            _, writer = await asyncio.open_connection("127.0.0.1", int(address.split(":")[1]))
            writer.write(push_header(GOOD) + b"ab")
            await writer.drain()
            await eventually(lambda: leftovers(store.directory) != [])
            with pytest.raises(ReplicationError, match="already under way"):
                await push_replica(address, OWNER, make_folder(local, 7, {"a": b"abcd"}))
            writer.close()
            await eventually(lambda: leftovers(store.directory) == [])
            await push_replica(address, OWNER, make_folder(local / "again", 7, {"a": b"abcd"}))

    run(test)
    assert store.inventory() == {OWNER: [7]}
