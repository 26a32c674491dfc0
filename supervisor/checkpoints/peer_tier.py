"""The peer tier: copies of each host's committed local checkpoint kept on k other hosts, sent over TCP.

A host that is lost takes its local tier with it; its replacement fetches the last step from a peer
holding a replica instead of reading the slower persistent tier. Supervisors push and fetch shard
folders (`slicekeeper.shard_folder` format) between each other, never through a shared directory.

Wire format, one request per connection, every header one JSON line:
    push   -> {"op": "push", "owner": o, "step": s, "manifest": n} + n bytes of manifest.json
           <- {"ok": true}   then -> each manifest file's bytes, in manifest order   <- {"ok": true}
    fetch  -> {"op": "fetch", "owner": o, "step": s}
           <- {"ok": true, "manifest": n} + n bytes of manifest.json + each file's bytes, in order
A refusal or failure is answered {"ok": false, "error": why}. Receivers write `step-X.tmp`, check
every file's sha256 against the manifest, write the manifest last and commit by rename.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

from slicekeeper.supervisor import connection_deadline
from slicekeeper.supervisor.tls import JobTls

from slicekeeper import shard_folder
from slicekeeper.shard_folder import CorruptCheckpoint, Manifest

CHUNK = 1 << 20
"""Bytes read or written per step of the event loop (the hang watchdog runs every 50 ms)."""
MAX_MANIFEST_BYTES = 64 << 20  # a header that announces more is refused
_log = logging.getLogger(__name__)
Seconds: TypeAlias = float | None  # a time limit, None for none
Reader: TypeAlias = asyncio.StreamReader
Writer: TypeAlias = asyncio.StreamWriter
Connection: TypeAlias = tuple[Reader, Writer]


def replica_holders(
    owner: int, host_count: int, hosts_per_slice: int, replicas: int, active: Collection[int] | None = None
) -> list[int]:
    """The hosts that keep `owner`'s replicas, in order: first the same worker index on the following
    slices (so a copy survives the loss of a whole slice), then the other hosts in ring order after owner.
    Only hosts in `active` (the current world; default all) are chosen. Never includes owner; at most
    `replicas` entries; deterministic."""
    if hosts_per_slice < 1 or host_count % hosts_per_slice or not 0 <= owner < host_count or replicas < 0:
        raise ValueError(
            f"no replica placement for host {owner} of {host_count} ({hosts_per_slice} per slice)"
        )
    if replicas == 0:
        return []
    chosen: list[int] = []
    allowed = active if active is None or isinstance(active, (set, frozenset)) else set(active)
    worker = owner % hosts_per_slice
    # Found in order and no further than needed: a job of 25,000 hosts asks this at every save.
    same_worker = (
        (owner + k * hosts_per_slice) % host_count for k in range(1, host_count // hosts_per_slice)
    )
    ring = ((owner + k) % host_count for k in range(1, host_count))
    for host in itertools.chain(same_worker, (h for h in ring if h % hosts_per_slice != worker)):
        if allowed is None or host in allowed:
            chosen.append(host)
            if len(chosen) == replicas:
                break
    return chosen


class ReplicationError(Exception):
    """A push or fetch failed: connection, refusal, checksum at the receiver, timeout."""


class _Refused(Exception):
    """The peer answered a request with an error (its reason is the message)."""


@dataclass(frozen=True)
class Transfer:
    """What one push or fetch moved: the step, its files' bytes (manifest excluded), the wall time."""

    step: int
    bytes: int
    seconds: float


class ReplicaStore:
    """Replicas this machine holds for other hosts: <directory>/host-<owner>/step-XXXXXXXX/
    (shard_folder format), the newest `keep` committed steps per owner."""

    def __init__(self, directory: Path, keep: int) -> None:
        self.directory = directory
        self.keep = keep

    def _owner_dir(self, owner: int) -> Path:
        return self.directory / f"host-{owner}"

    def steps(self, owner: int) -> list[int]:
        return shard_folder.committed_steps(self._owner_dir(owner))

    def inventory(self) -> dict[int, list[int]]:
        """Owner -> committed steps held, for every owner with at least one."""
        names = (entry.name.removeprefix("host-") for entry in self.directory.glob("host-*"))
        held = {int(name): self.steps(int(name)) for name in names if name.isdigit()}
        return {owner: steps for owner, steps in sorted(held.items()) if steps}

    def folder(self, owner: int, step: int) -> Path:
        return shard_folder.step_dir(self._owner_dir(owner), step)

    def quarantine(self, owner: int, step: int) -> None:
        shard_folder.quarantine(self.folder(owner, step))


def _finish(tmp: Path, manifest: Manifest, final: Path) -> None:
    """Blocking: manifest last, fsync, rename; a failure removes `tmp`."""
    try:
        shard_folder.write_manifest(tmp, manifest)
        shard_folder.fsync_path(tmp)
        shard_folder.commit(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def _write_line(writer: Writer, message: dict[str, Any], idle: Seconds) -> None:
    writer.write(json.dumps(message).encode() + b"\n")
    async with asyncio.timeout(idle):
        await writer.drain()


async def _read_line(reader: Reader, idle: Seconds, reply: bool = False) -> dict[str, Any]:
    """One JSON header; for a `reply`, _Refused unless it is {"ok": true, ...}."""
    async with asyncio.timeout(idle):
        line = await reader.readline()
    if not line.endswith(b"\n"):
        raise EOFError("connection closed before a complete header")
    with contextlib.suppress(ValueError, RecursionError):  # RecursionError: nested too deeply
        if isinstance(message := json.loads(line), dict):
            if reply and message.get("ok") is not True:
                raise _Refused(f"refused: {message.get('error', 'no reason given')}")
            return message
    raise ValueError(f"bad header {line[:80]!r}")


def _count(message: dict[str, Any], key: str) -> int:
    if isinstance(value := message.get(key), int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"header field {key!r} is not a count: {value!r}")


async def _read_manifest(reader: Reader, size: int, step: int, where: str, idle: Seconds) -> Manifest:
    if size > MAX_MANIFEST_BYTES:
        raise ValueError(f"manifest of {size} bytes is too large")
    async with asyncio.timeout(idle):
        text = await reader.readexactly(size)
    manifest = Manifest.from_json(text.decode(errors="replace"), where)
    files = [s.file for s in manifest.shards]
    if manifest.step != step or len(set(files)) != len(files) or any(s.size < 0 for s in manifest.shards):
        raise CorruptCheckpoint(f"{where}: manifest does not describe step {step} with distinct files")
    return manifest


async def _receive_files(reader: Reader, manifest: Manifest, tmp: Path, idle: Seconds) -> None:
    """Write `manifest`'s files into a new folder `tmp`, then CorruptCheckpoint if one is not as listed."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    wrong = []
    for shard in manifest.shards:
        digest = hashlib.sha256()
        with (tmp / shard.file).open("wb") as out:
            for offset in range(0, shard.size, CHUNK):
                async with asyncio.timeout(idle):
                    chunk = await reader.readexactly(min(shard.size - offset, CHUNK))
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            await asyncio.to_thread(os.fsync, out.fileno())
        if digest.hexdigest() != shard.sha256:
            wrong.append(shard.file)
    if wrong:
        raise CorruptCheckpoint(f"checksum mismatch in transit for {', '.join(wrong)}")


def _chunks(path: Path, size: int) -> Iterator[bytes]:
    """The file's bytes, at most CHUNK at a time; CorruptCheckpoint unless it is readable and `size` long."""
    try:
        with path.open("rb") as source:
            if os.fstat(source.fileno()).st_size != size:
                raise CorruptCheckpoint(f"{path}: size differs from its manifest entry ({size} bytes)")
            while size and (chunk := source.read(min(size, CHUNK))):  # cut short: the hash tells
                size -= len(chunk)
                yield chunk
    except OSError as error:
        raise CorruptCheckpoint(f"{path}: unreadable ({error.strerror or error})") from None


async def _send_files(writer: Writer, folder: Path, manifest: Manifest, idle: Seconds) -> None:
    """Stream `manifest`'s files, hashing what is sent; CorruptCheckpoint at the first one not as listed."""
    for shard in manifest.shards:
        digest = hashlib.sha256()
        for chunk in _chunks(folder / shard.file, shard.size):
            digest.update(chunk)
            writer.write(chunk)
            async with asyncio.timeout(idle):
                await writer.drain()
        if digest.hexdigest() != shard.sha256:
            raise CorruptCheckpoint(f"{folder / shard.file}: checksum mismatch for shard {shard.name}")


class ReplicaServer:
    """One supervisor's replica endpoint (asyncio TCP, JSON header lines + raw bytes)."""

    def __init__(
        self,
        store: ReplicaStore,
        idle_timeout: float = 60.0,
        own_copy: Callable[[int, int], Path | None] | None = None,
        tls: JobTls | None = None,
        connection_deadline: float = 0.0,
    ) -> None:
        """`tls`: the job's credentials, required of every client (None: plain TCP, for benchmarks
        that measure what TLS costs). `connection_deadline`: seconds of silence that end a peer's
        connection (supervisor.connection_deadline; 0: none)."""
        self.connection_deadline = connection_deadline
        self.store = store
        self.tls = tls
        self.own_copy = own_copy or (lambda owner, step: None)
        """(owner, step) -> this machine's own committed local step folder, when owner is its host:
        a host rejoining after a scale-down restores its twin's shard from the twin's local tier."""
        self.idle_timeout = idle_timeout  # seconds a peer may stay silent (or not read) before it is dropped
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[Any], Writer] = {}
        self._receiving: set[tuple[int, int]] = set()

    async def serve(self, address: str, port: int) -> int:
        self._server = await asyncio.start_server(self._handle, address, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening and drop the connections under way (their handlers clean up and end)."""
        if self._server is None:
            return
        self._server.close()
        for writer in self._connections.values():
            writer.transport.abort()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, reader: Reader, writer: Writer) -> None:
        if self.tls is not None and not await self.tls.accept("peer", writer):
            return  # refused (aborted, counted, said) before a byte was read; bounded by its timeout
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        try:
            connection_deadline.impose_on(writer, self.connection_deadline)
            request = await _read_line(reader, self.idle_timeout)
            owner, step = _count(request, "owner"), _count(request, "step")
            if request.get("op") == "push":
                await self._receive(owner, step, _count(request, "manifest"), reader, writer)
            elif request.get("op") == "fetch":
                await self._send(owner, step, writer)
            else:
                raise ValueError(f"unknown request {request.get('op')!r}")
        except (_Refused, CorruptCheckpoint, ValueError, EOFError, OSError) as error:
            reason = "timed out" if isinstance(error, TimeoutError) else str(error) or repr(error)
            _log.warning("replica request from %s failed: %s", writer.get_extra_info("peername"), reason)
            with contextlib.suppress(OSError, TimeoutError):
                await _write_line(writer, {"ok": False, "error": reason}, 1.0)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            self._connections.pop(task, None)

    async def _receive(self, owner: int, step: int, size: int, reader: Reader, writer: Writer) -> None:
        where = f"replica of host {owner} step {step}"
        manifest = await _read_manifest(reader, size, step, where, self.idle_timeout)
        if (owner, step) in self._receiving:
            raise _Refused(f"{where}: a push of this step is already under way")
        self._receiving.add((owner, step))
        tmp = shard_folder.tmp_dir(self.store._owner_dir(owner), step)
        finishing = False
        try:
            await _write_line(writer, {"ok": True}, self.idle_timeout)
            await _receive_files(reader, manifest, tmp, self.idle_timeout)
            finishing = True  # from here the commit thread owns `tmp` (and cleans it up on failure)
            await asyncio.to_thread(_finish, tmp, manifest, self.store.folder(owner, step))
            await asyncio.to_thread(shard_folder.retain, self.store._owner_dir(owner), self.store.keep)
        finally:
            if not finishing:
                shutil.rmtree(tmp, ignore_errors=True)
            self._receiving.discard((owner, step))
        await _write_line(writer, {"ok": True}, self.idle_timeout)

    async def _send(self, owner: int, step: int, writer: Writer) -> None:
        own = self.own_copy(owner, step)
        if own is None and step not in self.store.steps(owner):
            raise _Refused(f"not held: host {owner} step {step} (held: {self.store.steps(owner)})")
        folder = own or self.store.folder(owner, step)
        try:
            manifest = await asyncio.to_thread(shard_folder.verify, folder)
        except CorruptCheckpoint as error:
            if own is None:
                self.store.quarantine(owner, step)
            raise _Refused(f"corrupt: {error}" + ("" if own else "; quarantined")) from None
        text = manifest.to_json().encode()
        await _write_line(writer, {"ok": True, "manifest": len(text)}, self.idle_timeout)
        writer.write(text)
        try:
            await _send_files(writer, folder, manifest, self.idle_timeout)
        except CorruptCheckpoint:
            writer.transport.abort()  # changed since verified: the fetcher sees a cut stream
            raise


@contextlib.asynccontextmanager
async def _session(
    address: str, what: str, timeout: float, source: bool, tls: JobTls | None, deadline: float
) -> AsyncIterator[Connection]:
    """A connection to the peer at "host:port" for one request, under `timeout`; every failure becomes a
    ReplicationError, except CorruptCheckpoint when `source` (our own folder is bad, not the transfer)."""
    writer = None
    try:
        async with asyncio.timeout(timeout):
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"not a host:port address: {address!r}")
            # A peer cut off never answers a SYN: the connection's deadline bounds the wait for it too.
            async with asyncio.timeout(deadline or None):
                if tls is None:
                    reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
                else:
                    reader, writer = await tls.connect(host.strip("[]"), int(port))
            connection_deadline.impose_on(writer, deadline)
            yield reader, writer
    except (_Refused, CorruptCheckpoint, ValueError, EOFError, OSError) as error:
        if writer is not None:
            writer.transport.abort()
        if source and isinstance(error, CorruptCheckpoint):
            raise
        reason = f"timed out after {timeout:g} s" if isinstance(error, TimeoutError) else str(error)
        if isinstance(error, EOFError):
            reason = f"stream cut short ({reason})"
        raise ReplicationError(f"{what}: {reason or repr(error)}") from None
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def push_replica(
    address: str,
    owner: int,
    folder: Path,
    timeout: float = 30.0,
    tls: JobTls | None = None,
    connection_deadline: float = 0.0,
) -> Transfer:
    """Send the committed shard folder `folder` (owner's step-X) to the ReplicaServer at "host:port".
    Raises ReplicationError on any failure, CorruptCheckpoint if the source folder does not match its
    own manifest (checked while streaming: hash what you send)."""
    manifest = shard_folder.read_manifest(folder)
    text = manifest.to_json().encode()
    start = time.monotonic()
    what = f"push of host {owner} step {manifest.step} to {address}"
    async with _session(address, what, timeout, True, tls, connection_deadline) as (reader, writer):
        request = {"op": "push", "owner": owner, "step": manifest.step, "manifest": len(text)}
        await _write_line(writer, request, None)
        writer.write(text)
        await _read_line(reader, None, reply=True)
        await _send_files(writer, folder, manifest, None)
        await _read_line(reader, None, reply=True)
    return Transfer(manifest.step, manifest.total_bytes, time.monotonic() - start)


async def fetch_replica(
    address: str,
    owner: int,
    step: int,
    destination: Path,
    timeout: float = 60.0,
    tls: JobTls | None = None,
    connection_deadline: float = 0.0,
) -> Transfer:
    """Fetch owner's step from the ReplicaServer at address into `destination` (a directory, e.g. the
    owner's new local tier dir): written to destination/step-X.tmp, every file's sha256 verified, then
    committed to destination/step-X. Raises ReplicationError (not held, corrupt at the holder, mismatch
    in transit, connection/timeout); a failed fetch leaves nothing committed and no .tmp behind."""
    tmp = shard_folder.tmp_dir(destination, step)
    start = time.monotonic()
    what = f"fetch of host {owner} step {step} from {address}"
    try:
        async with _session(address, what, timeout, False, tls, connection_deadline) as (reader, writer):
            await _write_line(writer, {"op": "fetch", "owner": owner, "step": step}, None)
            reply = await _read_line(reader, None, reply=True)
            manifest = await _read_manifest(reader, _count(reply, "manifest"), step, what, None)
            await _receive_files(reader, manifest, tmp, None)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:  # all bytes are here and verified: committing them is not subject to the network timeout
        await asyncio.to_thread(_finish, tmp, manifest, shard_folder.step_dir(destination, step))
    except OSError as error:
        raise ReplicationError(f"{what}: cannot commit in {destination}: {error}") from None
    return Transfer(step, manifest.total_bytes, time.monotonic() - start)
