"""Benchmark of what TLS costs the peer tier: push and fetch of a shard folder, and the handshake.

Why: every connection between a job's supervisors is mutual TLS (supervisor/tls.py), so each replica a
host pushes after a save, and the shard a spare fetches in a hot-swap, is encrypted and both ends
authenticated, on a new connection per transfer. This script puts a price on that for the peer tier
alone, in one process, with the real `ReplicaServer` and `push_replica` / `fetch_replica` over
loopback: plain TCP (`tls=None`, which the peer tier allows for this measurement) against TLS with a
job's credentials (`slicekeeper.credentials.generate(...).write(dir)`, then `JobTls(dir)`).

Shard folders (`slicekeeper.shard_folder` format, random bytes), made once under /dev/shm (where the
example job keeps its local tier and its replicas) or the temp directory failing that:

- `example`: the size of one host's shard of the example job (examples/trainingjob.yaml, measured on
  a local run: 74 files, 662,664 bytes; here the bytes are split evenly over the files);
- `large`: `--large-mb` MiB (default 64) in files of 1 MiB.

Figures, over `--repetitions` transfers of each folder in each mode (after one warm-up of each), the
two modes interleaved and taking turns to go first, so that a busy machine slows both alike:

1. push: `push_replica` of the folder to the server, which writes it, checks every sha256 and commits
   it: seconds per transfer (`Transfer.seconds`: connect and handshake included) and MB/s (the
   folder's bytes, manifest excluded, over those seconds);
2. fetch: `fetch_replica` of that step back into an empty directory (sha256 checked in transit,
   committed): the same;
3. handshake, over `--handshakes` connections to the server: connect (and, with TLS, the handshake)
   until the client's streams are ready, and until the server's first reply to a request (a fetch of
   a step it does not hold, refused), which includes the server's check of the client's certificate;

and for each, TLS / plain: the ratio of the seconds of each interleaved pair.

Both ends share one event loop, so a transfer's time is the sender's and the receiver's work
together (hashing, encryption, decryption, copies), as on a machine whose supervisors have one core
between them. Every pushed replica and every fetched folder is compared with the source's manifest
and hashed again (`shard_folder.verify`) outside the timed part; a failed transfer, a mismatch or a
connection the server refused ends the benchmark with status 1.

    .venv/bin/python benchmarks/peer_tls.py [--repetitions 10] [--handshakes 50] [--large-mb 64]
        [--json out.json]

The table is harness.format_table (imported from this directory, as the other benchmarks do).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from harness import Row, format_table, say
from slicekeeper.supervisor.checkpoints import peer_tier
from slicekeeper.supervisor.checkpoints.peer_tier import (
    ReplicaServer,
    ReplicaStore,
    fetch_replica,
    push_replica,
)
from slicekeeper.supervisor.tls import JobTls

from slicekeeper import credentials, shard_folder
from slicekeeper.shard_folder import Manifest, ShardFile

MB = 1e6
MIB = 1 << 20
EXAMPLE_FILES, EXAMPLE_BYTES = 74, 662_664
"""One host's shard of the example job, as a local run's `host-1/local/step-*` holds it."""
OWNER, STEP = 1, 1
HOST = "127.0.0.1"
MODES = ("plain", "TLS")
TIMEOUT_SECONDS = 120.0
"""Per transfer; far above what one takes, so that only a broken one hits it."""


class BenchmarkFailed(Exception):
    """A transfer failed, a copy differs from its source, or the server refused a connection."""


@dataclass(frozen=True)
class FolderShape:
    name: str
    files: int
    bytes: int


@dataclass
class Samples:
    """One measurement's seconds, per mode, in repetition order (pairs share an index)."""

    seconds: dict[str, list[float]] = field(default_factory=lambda: {mode: [] for mode in MODES})
    cpu_seconds: dict[str, list[float]] = field(default_factory=lambda: {mode: [] for mode in MODES})


# --- shard folders ----------------------------------------------------------------------------------
def make_folder(directory: Path, shape: FolderShape) -> Path:
    """A committed shard folder of `shape` (random bytes), written as a workload writes its own."""
    tmp = shard_folder.tmp_dir(directory, STEP)
    tmp.mkdir(parents=True)
    base, extra = divmod(shape.bytes, shape.files)
    shards = []
    for index in range(shape.files):
        path = tmp / f"{index:05d}.npy"
        path.write_bytes(os.urandom(base + (index < extra)))
        size = path.stat().st_size
        shards.append(ShardFile(f"leaf{index:04d}/0", path.name, shard_folder.sha256_file(path), size))
    shard_folder.write_manifest(tmp, Manifest(STEP, tuple(shards)))
    final = shard_folder.step_dir(directory, STEP)
    shard_folder.commit(tmp, final)
    return final


def check_copy(copy: Path, source: Manifest, what: str) -> None:
    """BenchmarkFailed unless `copy` is committed, hashes as its manifest says and that is `source`'s."""
    try:
        manifest = shard_folder.verify(copy)
    except shard_folder.CorruptCheckpoint as error:
        raise BenchmarkFailed(f"{what}: {error}") from None
    if manifest != source:
        raise BenchmarkFailed(f"{what}: the copy's manifest differs from the source's")


# --- measuring --------------------------------------------------------------------------------------
@dataclass
class Endpoints:
    """A plain and a TLS server, each with its own store, and the clients' credentials."""

    work: Path
    servers: dict[str, ReplicaServer]
    addresses: dict[str, str]
    client_tls: dict[str, JobTls | None]
    refusals: list[str]


async def open_endpoints(work: Path) -> Endpoints:
    secrets = credentials.generate("bench-peer-tls").write(work / "credentials")
    refusals: list[str] = []
    server_tls = JobTls(secrets, refused=lambda port: None, say=refusals.append)
    servers = {
        "plain": ReplicaServer(ReplicaStore(work / "store-plain", keep=1), idle_timeout=TIMEOUT_SECONDS),
        "TLS": ReplicaServer(
            ReplicaStore(work / "store-tls", keep=1), idle_timeout=TIMEOUT_SECONDS, tls=server_tls
        ),
    }
    addresses = {mode: f"{HOST}:{await server.serve(HOST, 0)}" for mode, server in servers.items()}
    return Endpoints(work, servers, addresses, {"plain": None, "TLS": JobTls(secrets)}, refusals)


async def timed(call: Callable[[], Awaitable[peer_tier.Transfer]]) -> tuple[float, float]:
    """(wall seconds as the transfer counts them, CPU seconds of this process meanwhile)."""
    cpu = time.process_time()
    try:
        transfer = await call()
    except (peer_tier.ReplicationError, shard_folder.CorruptCheckpoint) as error:
        raise BenchmarkFailed(str(error)) from None
    return transfer.seconds, time.process_time() - cpu


async def measure_transfers(ends: Endpoints, folder: Path, repetitions: int) -> tuple[Samples, Samples]:
    """(push, fetch) samples of `folder`, each checked against the source after it is timed."""
    source = shard_folder.read_manifest(folder)
    push, fetch = Samples(), Samples()
    for repetition in range(-1, repetitions):  # -1: the warm-up, not counted
        order = MODES if repetition % 2 == 0 else MODES[::-1]
        for mode in order:
            address, tls = ends.addresses[mode], ends.client_tls[mode]
            seconds, cpu = await timed(
                partial(push_replica, address, OWNER, folder, timeout=TIMEOUT_SECONDS, tls=tls)
            )
            check_copy(ends.servers[mode].store.folder(OWNER, STEP), source, f"push [{mode}]")
            if repetition >= 0:
                push.seconds[mode].append(seconds)
                push.cpu_seconds[mode].append(cpu)
        for mode in order:
            address, tls = ends.addresses[mode], ends.client_tls[mode]
            destination = ends.work / f"fetched-{mode}"
            shutil.rmtree(destination, ignore_errors=True)
            seconds, cpu = await timed(
                partial(fetch_replica, address, OWNER, STEP, destination, timeout=TIMEOUT_SECONDS, tls=tls)
            )
            check_copy(shard_folder.step_dir(destination, STEP), source, f"fetch [{mode}]")
            if repetition >= 0:
                fetch.seconds[mode].append(seconds)
                fetch.cpu_seconds[mode].append(cpu)
    return push, fetch


async def handshake_once(ends: Endpoints, mode: str) -> tuple[float, float]:
    """(connected, first reply) seconds after the connection began, on one new connection."""
    port = int(ends.addresses[mode].rpartition(":")[2])
    tls = ends.client_tls[mode]
    start = time.perf_counter()
    if tls is None:
        reader, writer = await asyncio.open_connection(HOST, port)
    else:
        reader, writer = await tls.connect(HOST, port)
    connected = time.perf_counter()
    try:
        writer.write(json.dumps({"op": "fetch", "owner": OWNER + 1, "step": STEP}).encode() + b"\n")
        await writer.drain()
        async with asyncio.timeout(TIMEOUT_SECONDS):
            line = await reader.readline()
        replied = time.perf_counter()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    if not line.startswith(b'{"ok": false'):
        raise BenchmarkFailed(f"handshake [{mode}]: the server answered {line[:80]!r}, not a refusal")
    return connected - start, replied - start


async def measure_handshakes(ends: Endpoints, count: int) -> tuple[Samples, Samples]:
    """(connected, first reply) samples over `count` connections per mode, after one warm-up each."""
    connect, reply = Samples(), Samples()
    # The server logs each refused fetch as a warning; here they are the request asked for.
    logging.getLogger(peer_tier.__name__).setLevel(logging.ERROR)
    for repetition in range(-1, count):
        for mode in MODES if repetition % 2 == 0 else MODES[::-1]:
            connected, replied = await handshake_once(ends, mode)
            if repetition >= 0:
                connect.seconds[mode].append(connected)
                reply.seconds[mode].append(replied)
    return connect, reply


@dataclass
class Results:
    shapes: list[FolderShape]
    transfers: dict[str, dict[str, Samples]]
    """Shape name -> "push" / "fetch" -> samples."""
    handshakes: dict[str, Samples]
    """The `connect` and `first reply` samples."""


async def measure(work: Path, shapes: list[FolderShape], repetitions: int, handshakes: int) -> Results:
    ends = await open_endpoints(work)
    try:
        transfers = {}
        for shape in shapes:
            folder = make_folder(work / f"source-{shape.name}", shape)
            say(f"{shape.name}: {shape.files} files, {shape.bytes / MB:.3f} MB; {repetitions} repetitions")
            push, fetch = await measure_transfers(ends, folder, repetitions)
            transfers[shape.name] = {"push": push, "fetch": fetch}
            shutil.rmtree(folder.parent, ignore_errors=True)
        say(f"handshakes: {handshakes} connections per mode")
        connect, reply = await measure_handshakes(ends, handshakes)
    finally:
        for server in ends.servers.values():
            await server.close()
    if ends.refusals:
        raise BenchmarkFailed(f"the TLS server refused connections: {ends.refusals}")
    return Results(shapes, transfers, {"connect": connect, "first reply": reply})


# --- the table --------------------------------------------------------------------------------------
def ratios(samples: Samples) -> list[float]:
    return [tls / plain for plain, tls in zip(samples.seconds["plain"], samples.seconds["TLS"], strict=True)]


def build_rows(results: Results) -> list[Row]:
    rows = []
    for shape in results.shapes:
        for direction, samples in results.transfers[shape.name].items():
            label = f"{direction} [{shape.name}, {shape.bytes / MB:.2f} MB]"
            for mode in MODES:
                seconds = samples.seconds[mode]
                rows.append(Row(f"{label} {mode}, time per transfer", [s * 1000 for s in seconds], "ms"))
            for mode in MODES:
                seconds = samples.seconds[mode]
                rows.append(Row(f"{label} {mode}, MB/s", [shape.bytes / MB / s for s in seconds], ""))
            rows.append(Row(f"{label} TLS / plain, time", ratios(samples), ""))
    for name, samples in results.handshakes.items():
        for mode in MODES:
            # The unit goes in the name: format_value rounds milliseconds to 0.1, too coarse here.
            rows.append(Row(f"handshake: {name} [{mode}], ms", [s * 1000 for s in samples.seconds[mode]], ""))
        rows.append(Row(f"handshake: {name}, TLS / plain", ratios(samples), ""))
    return rows


def raw(results: Results) -> dict[str, Any]:
    def samples(s: Samples) -> dict[str, Any]:
        return {"seconds": s.seconds, "cpu_seconds": s.cpu_seconds}

    return {
        "transfers": {
            shape.name: {
                "files": shape.files,
                "bytes": shape.bytes,
                **{direction: samples(s) for direction, s in results.transfers[shape.name].items()},
            }
            for shape in results.shapes
        },
        "handshakes": {name: s.seconds for name, s in results.handshakes.items()},
    }


# --- entry ------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Measure what TLS costs the peer tier: push and fetch throughput of a shard folder "
        "and the handshake, plain TCP against TLS, over loopback in one process."
    )
    parser.add_argument("--repetitions", type=int, default=10, help="transfers per folder and mode (10)")
    parser.add_argument("--handshakes", type=int, default=50, help="connections per mode (default 50)")
    parser.add_argument("--large-mb", type=int, default=64, help="size of the large folder in MiB (64)")
    parser.add_argument("--json", type=Path, help="write the raw figures and the summary here")
    args = parser.parse_args(argv)
    if args.repetitions < 1 or args.handshakes < 1 or args.large_mb < 1:
        parser.error("--repetitions, --handshakes and --large-mb must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    shapes = [
        FolderShape("example", EXAMPLE_FILES, EXAMPLE_BYTES),
        FolderShape("large", args.large_mb, args.large_mb * MIB),
    ]
    shm = Path("/dev/shm")
    work = Path(tempfile.mkdtemp(prefix="slicekeeper-bench-peer-tls-", dir=shm if shm.is_dir() else None))
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    machine = f"{platform.node()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"
    say("peer tier benchmark: push, fetch and handshake, plain TCP against TLS, over loopback")
    say(f"  started {started_at} on {machine}; load average {os.getloadavg()[0]:.2f}; work dir {work}")
    try:
        results = asyncio.run(measure(work, shapes, args.repetitions, args.handshakes))
    except BenchmarkFailed as error:
        say(f"FAILED: {error}")
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = build_rows(results)
    say("")
    say(
        f"{args.repetitions} transfers per folder and mode, {args.handshakes} connections per mode; "
        f"median/min/max; load average at the end {os.getloadavg()[0]:.2f}"
    )
    say(format_table(rows, args.repetitions))
    if args.json:
        summary = [row.summary() for row in rows]
        args.json.write_text(
            json.dumps(
                {
                    "started_at": started_at,
                    "machine": machine,
                    "cpu_count": os.cpu_count(),
                    "repetitions": args.repetitions,
                    "handshakes": args.handshakes,
                    "summary": summary,
                    "raw": raw(results),
                },
                indent=1,
            )
        )
        say(f"raw figures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
