"""The persistent tier: checkpoints that survive the loss of every host, in a directory or object store.

The local tier is fast but dies with the hosts; every so often each host's supervisor copies its
committed shard folder (`slicekeeper.shard_folder` format) here, and a job that lost its hosts
restores from here. The location is any fsspec URI: a plain path, `file://`, `memory://` (tests),
`gs://` or `s3://` (with gcsfs or s3fs installed). The layout under `<uri>/<run_key>/`:

    step-00000045/
      host-0/00000.npy ...       one host's shard folder, its files uploaded first
      host-0/manifest.json       uploaded last: without it the host's shard is incomplete
      host-1/...
      COMMITTED                  written by the job's leader once every host's manifest is there

Object stores have no atomic rename, so markers take its place. Commit rule: a step is committed
when, and only when, its COMMITTED marker exists; a step without it is never listed and never
restored. A host's shard counts as uploaded only when its manifest exists, and it is uploaded only
after every file was hashed while copying and matched the manifest. Deletion runs in the opposite
order (marker first), so a half-deleted step is never seen as committed.

All methods block (the supervisor calls them through supervisor.checkpoints.store_calls, under a
deadline, tried a bounded number of times). Any failure of the store is raised as
PersistentTierError (object-store clients raise their own exception types, so the cause is
chained); a shard that does not match its manifest raises shard_folder.CorruptCheckpoint.

Every object read from the store is counted where it is read (`reads`): a restore that claims to
have come from elsewhere can be checked against what the store actually served.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from fsspec.core import url_to_fs  # type: ignore[import-untyped]
from slicekeeper.supervisor.checkpoint_vocabulary import StoreReads

from slicekeeper import shard_folder
from slicekeeper.shard_folder import MANIFEST, STEP_PREFIX, CorruptCheckpoint, Manifest, ShardFile

COMMITTED = "COMMITTED"
HOST_PREFIX = "host-"
CHUNK = shard_folder.HASH_BLOCK
"""Bytes copied at a time, so memory stays flat however big a shard is."""


class PersistentTierError(Exception):
    """The persistent tier is unreachable or an operation on it failed; the message names the URI."""


def _reason(error: BaseException) -> str:
    """A short, actionable description of why a store operation failed."""
    if isinstance(error, ImportError):
        return f"the protocol needs an extra package: {error}"
    if isinstance(error, ValueError) and "Protocol not known" in str(error):
        return f"unknown protocol ({error})"
    if isinstance(error, PermissionError):
        return f"permission denied ({error})"
    if isinstance(error, NotADirectoryError | FileExistsError):
        return f"not a directory: a component of the path is a file ({error})"
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return f"no space left ({error})"
    return f"{type(error).__name__}: {error}"


def _copy(source: IO[bytes], sink: IO[bytes], shard: ShardFile, where: str) -> int:
    """Copy in chunks, hashing while copying; raise CorruptCheckpoint unless size and hash match."""
    digest = hashlib.sha256()
    size = 0
    while block := source.read(CHUNK):
        digest.update(block)
        sink.write(block)
        size += len(block)
    if size != shard.size or digest.hexdigest() != shard.sha256:
        raise CorruptCheckpoint(f"{where}: checksum mismatch for shard {shard.name}")
    return size


class PersistentTier:
    def __init__(self, uri: str, run_key: str, *, call_timeout: float = 300.0, attempts: int = 3) -> None:
        """`call_timeout`, `attempts`: what the supervisor gives each call before it gives up, and
        how often it tries (supervisor.checkpoints.store_calls; spec.checkpoint.persistent)."""
        self.call_timeout, self.attempts = call_timeout, attempts
        key = run_key.strip("/")
        if not key or any(part in ("", ".", "..") for part in key.split("/")):
            raise ValueError(f"invalid run key {run_key!r}: expected non-empty path segments")
        self._location = f"{uri.rstrip('/')}/{key}"
        self._fs: Any = None
        self._resolve_error: Exception | None = None
        try:
            self._fs, root = url_to_fs(uri)
        except Exception as error:  # reported by probe() and every later call, with the reason
            self._resolve_error = error
            root = ""
        self._base = f"{str(root).rstrip('/')}/{key}"
        self.reads = StoreReads()

    @property
    def location(self) -> str:
        return self._location

    # -- paths --------------------------------------------------------------------------------

    def _step_path(self, step: int) -> str:
        return f"{self._base}/{STEP_PREFIX}{step:08d}"

    def _host_path(self, step: int, host: int) -> str:
        return f"{self._step_path(step)}/{HOST_PREFIX}{host}"

    def _where(self, path: str) -> str:
        """`path` (below the base) as a URI for messages."""
        return self._location + path.removeprefix(self._base)

    # -- helpers ------------------------------------------------------------------------------

    def _filesystem(self) -> Any:
        if self._fs is None:
            assert self._resolve_error is not None
            raise PersistentTierError(
                f"{self._location}: cannot use the location: {_reason(self._resolve_error)}"
            ) from self._resolve_error
        return self._fs

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[Any]:
        """Yield the filesystem; turn any store failure into a PersistentTierError naming the URI."""
        fs = self._filesystem()
        try:
            yield fs
        except (CorruptCheckpoint, PersistentTierError):
            raise
        except Exception as error:
            raise PersistentTierError(f"{self._location}: {action} failed: {_reason(error)}") from error

    def _fresh(self, fs: Any) -> None:
        """Drop cached listings: other hosts write to the store behind this instance's back."""
        fs.invalidate_cache()

    def _read_manifest(self, fs: Any, folder: str) -> Manifest:
        where = self._where(folder)
        try:
            data = self._read_object(fs, f"{folder}/{MANIFEST}")
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{where}: no manifest") from None
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise CorruptCheckpoint(f"{where}: unreadable manifest") from None
        return Manifest.from_json(text, where)

    def _read_object(self, fs: Any, path: str) -> bytes:
        """A small object (a manifest, a marker), read whole and counted."""
        with fs.open(path, "rb") as file:
            data: bytes = file.read()
        self.reads.objects += 1
        self.reads.bytes += len(data)
        return data

    def _remove(self, fs: Any, folder: str, marker: str = MANIFEST) -> None:
        """Delete `folder`, its marker (manifest or COMMITTED) first."""
        if fs.exists(f"{folder}/{marker}"):
            fs.rm(f"{folder}/{marker}")
        if fs.exists(folder):
            fs.rm(folder, recursive=True)

    def _step_folders(self, fs: Any) -> list[int]:
        try:
            entries = fs.ls(self._base, detail=False)
        except FileNotFoundError:
            return []
        steps = []
        for entry in entries:
            name = str(entry).rstrip("/").rsplit("/", 1)[-1]
            if name.startswith(STEP_PREFIX):
                with contextlib.suppress(ValueError):
                    steps.append(int(name.removeprefix(STEP_PREFIX)))
        return sorted(steps)

    # -- public -------------------------------------------------------------------------------

    def probe(self) -> None:
        """Check that the location is reachable and writable: write, read back and delete an object."""
        with self._errors("probe (write, read back, delete a test object)") as fs:
            fs.makedirs(self._base, exist_ok=True)
            path = f"{self._base}/.probe-{uuid.uuid4().hex}"
            payload = b"slicekeeper probe\n"
            with fs.open(path, "wb") as file:
                file.write(payload)
            with fs.open(path, "rb") as file:
                read_back = file.read()
            fs.rm(path)
            if read_back != payload:
                raise PersistentTierError(f"{self._location}: probe read back different bytes")

    def upload(self, host: int, folder: Path) -> int:
        """Copy a committed local shard folder to step-X/host-H/, manifest last; return the shard bytes.

        Every file is hashed while copied and compared with the manifest: a mismatch raises
        CorruptCheckpoint and removes the partial upload (no manifest, so the host stays incomplete).
        Re-uploading an identical shard of an already committed step is a no-op returning 0.
        """
        manifest = shard_folder.read_manifest(folder)
        target = self._host_path(manifest.step, host)
        where = self._where(target)
        with self._errors(f"upload of {folder} to {where}") as fs:
            self._fresh(fs)
            if fs.exists(f"{self._step_path(manifest.step)}/{COMMITTED}"):
                with contextlib.suppress(CorruptCheckpoint):
                    if self._read_manifest(fs, target) == manifest:
                        return 0
                raise PersistentTierError(f"{where}: step {manifest.step} is committed with other content")
            self._remove(fs, target)
            fs.makedirs(target, exist_ok=True)
            sent = 0
            try:
                for shard in manifest.shards:
                    try:
                        source = (folder / shard.file).open("rb")
                    except FileNotFoundError:
                        raise CorruptCheckpoint(f"{folder}: file {shard.file} is missing") from None
                    with source, fs.open(f"{target}/{shard.file}", "wb") as sink:
                        sent += _copy(source, sink, shard, f"{folder / shard.file}")
                with fs.open(f"{target}/{MANIFEST}", "wb") as sink:
                    sink.write(manifest.to_json().encode())
            except BaseException:
                with contextlib.suppress(Exception):
                    self._remove(fs, target)
                raise
        return sent

    def hosts_uploaded(self, step: int) -> set[int]:
        """Hosts whose shard of `step` is completely uploaded (its manifest exists)."""
        step_name = f"{STEP_PREFIX}{step:08d}"
        with self._errors(f"listing the hosts of step {step}") as fs:
            self._fresh(fs)
            hosts = set()
            for path in fs.find(self._step_path(step)):
                parts = str(path).rstrip("/").split("/")
                if len(parts) >= 3 and parts[-1] == MANIFEST and parts[-3] == step_name:
                    with contextlib.suppress(ValueError):
                        hosts.add(int(parts[-2].removeprefix(HOST_PREFIX)))
            return hosts

    def commit(self, step: int) -> None:
        """Write the COMMITTED marker of `step` (the leader, once every host's shard is uploaded)."""
        hosts = self.hosts_uploaded(step)
        if not hosts:
            raise PersistentTierError(f"{self._location}: cannot commit step {step}: no host uploaded it")
        marker = f"{self._step_path(step)}/{COMMITTED}"
        with self._errors(f"commit of step {step}") as fs, fs.open(marker, "wb") as file:
            file.write(json.dumps({"step": step, "hosts": sorted(hosts)}).encode())

    def committed_owners(self) -> dict[int, set[int]]:
        """Committed step -> the hosts whose shard it holds (its COMMITTED marker says), oldest first.

        What a job that starts again (resumed, re-created, a new leader) finds of its earlier runs. A
        marker that cannot be parsed does not commit its step (as a missing one does not).
        """
        owners: dict[int, set[int]] = {}
        for step in self.committed_steps():
            with self._errors(f"reading the commit marker of step {step}") as fs:
                marker = self._read_object(fs, f"{self._step_path(step)}/{COMMITTED}")
            with contextlib.suppress(ValueError, KeyError, TypeError):
                owners[step] = {int(host) for host in json.loads(marker)["hosts"]}
        return owners

    def committed_steps(self) -> list[int]:
        """Steps with a COMMITTED marker, oldest first."""
        with self._errors("listing committed steps") as fs:
            self._fresh(fs)
            return [s for s in self._step_folders(fs) if fs.exists(f"{self._step_path(s)}/{COMMITTED}")]

    def manifest(self, host: int, step: int) -> Manifest:
        """The manifest of host's shard of `step` (what it holds and its checksums), not verified."""
        source = self._host_path(step, host)
        with self._errors(f"reading {self._where(source)}") as fs:
            self._fresh(fs)
            return self._read_manifest(fs, source)

    def download(self, host: int, step: int, destination: Path) -> int:
        """Copy host's shard of committed `step` to destination/step-X (via step-X.tmp), verified.

        Returns the shard bytes read. On a mismatch or a missing file, CorruptCheckpoint is raised and
        neither step-X nor step-X.tmp is left in `destination`.
        """
        source = self._host_path(step, host)
        # A folder of this call's own: a call given up (store_calls) may still be writing its own.
        final = shard_folder.step_dir(destination, step)
        tmp = final.with_name(f"{final.name}.{uuid.uuid4().hex[:8]}{shard_folder.TMP_SUFFIX}")
        with self._errors(f"download of {self._where(source)} to {destination}") as fs:
            self._fresh(fs)
            if not fs.exists(f"{self._step_path(step)}/{COMMITTED}"):
                raise PersistentTierError(f"{self._location}: step {step} is not committed")
            manifest = self._read_manifest(fs, source)
            if manifest.step != step:
                raise CorruptCheckpoint(f"{self._where(source)}: manifest is for step {manifest.step}")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            self.reads.shards += 1
            received = 0
            try:
                for shard in manifest.shards:
                    remote = f"{source}/{shard.file}"
                    try:
                        reader = fs.open(remote, "rb")
                    except FileNotFoundError:
                        raise CorruptCheckpoint(f"{self._where(remote)}: file is missing") from None
                    self.reads.objects += 1
                    with reader, (tmp / shard.file).open("wb") as sink:
                        try:
                            received += _copy(reader, sink, shard, self._where(remote))
                        finally:
                            self.reads.bytes += sink.tell()
                        sink.flush()
                        os.fsync(sink.fileno())
                shard_folder.write_manifest(tmp, manifest)
                shard_folder.commit(tmp, shard_folder.step_dir(destination, step))
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return received

    def retain(self, keep: int) -> None:
        """Keep the newest `keep` committed steps; delete older committed steps and the uncommitted
        steps older than the newest committed one (partial uploads that will never complete)."""
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        committed = self.committed_steps()
        if not committed:
            return
        with self._errors("retention") as fs:
            doomed = set(committed[:-keep])
            doomed |= {s for s in self._step_folders(fs) if s < committed[-1] and s not in committed}
            for step in sorted(doomed):
                self._remove(fs, self._step_path(step), marker=COMMITTED)
