"""The local checkpoint tier: one host's shards, written atomically with checksums.

Framework-agnostic (named numpy arrays), so the JAX and PyTorch trainers share it. A step is written
into `step-XXXXXXXX.tmp/`, every file fsynced, a manifest with each shard's sha256 written last, then
the folder is renamed to `step-XXXXXXXX/`: a save cut short by a kill stays a `.tmp` folder and is
never listed. Restore verifies every checksum and refuses a shard that does not match.

Why not orbax here: in a multi-process JAX job orbax writes numpy leaves only on process 0, refuses
host-local jax.Arrays, and its async path interleaves with the training step's gloo collectives and
deadlocks on CPU. A per-host copy of addressable shards is exactly what those rules forbid.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from slicekeeper import protocol

Shards = dict[str, np.ndarray]
"""Flat mapping of a shard's name (leaf and position) to its data."""

MANIFEST = protocol.LOCAL_MANIFEST
_PREFIX = protocol.LOCAL_STEP_PREFIX
_TMP = protocol.LOCAL_TMP_SUFFIX


class CorruptCheckpoint(Exception):
    """A committed step whose files do not match their recorded checksums."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalTier:
    """One host's local tier directory: async atomic saves, verified restores, retention."""

    def __init__(self, directory: str | Path, keep: int) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._keep = keep
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="slicekeeper-local-tier")

    def _step_dir(self, step: int) -> Path:
        return protocol.local_step_dir(self.directory, step)

    def committed_steps(self) -> list[int]:
        return protocol.committed_local_steps(self.directory)

    def save_async(self, step: int, shards: Shards) -> Future[None]:
        """Write `shards` for `step` in the background; the future fails if the save did."""
        return self._writer.submit(self._write, step, shards)

    def _write(self, step: int, shards: Shards) -> None:
        final = self._step_dir(step)
        tmp = final.with_name(final.name + _TMP)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        entries = {}
        for number, (name, array) in enumerate(sorted(shards.items())):
            file = tmp / f"{number:05d}.npy"
            with file.open("wb") as out:
                np.save(out, array, allow_pickle=False)
                out.flush()
                os.fsync(out.fileno())
            entries[name] = {"file": file.name, "sha256": _sha256(file)}
        manifest = tmp / MANIFEST
        manifest.write_text(json.dumps({"step": step, "shards": entries}, indent=1))
        with manifest.open("rb") as handle:
            os.fsync(handle.fileno())
        if final.exists():
            shutil.rmtree(final)  # a stale copy of this step (never agreed on) is replaced whole
        os.rename(tmp, final)
        _fsync_dir(self.directory)
        self._apply_retention()

    def _apply_retention(self) -> None:
        for step in self.committed_steps()[: -self._keep]:
            shutil.rmtree(self._step_dir(step), ignore_errors=True)

    def restore(self, step: int) -> Shards:
        """Read and verify every shard of `step`; raise CorruptCheckpoint on any mismatch."""
        folder = self._step_dir(step)
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
            entries = [
                (name, folder / entry["file"], entry["sha256"]) for name, entry in manifest["shards"].items()
            ]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise CorruptCheckpoint(f"{folder}: unreadable manifest ({error!r})") from None
        shards: Shards = {}
        for name, file, checksum in entries:
            if not file.is_file() or _sha256(file) != checksum:
                raise CorruptCheckpoint(f"{file}: checksum mismatch for shard {name}")
            shards[name] = np.load(file, allow_pickle=False)
        return shards

    def quarantine(self, step: int) -> None:
        """Set a corrupt step aside (kept for a post-mortem, never listed or restored again)."""
        folder = self._step_dir(step)
        if folder.exists():
            target = folder.with_name(folder.name + ".corrupt")
            shutil.rmtree(target, ignore_errors=True)
            os.rename(folder, target)

    def discard_after(self, step: int | None) -> None:
        """Drop steps newer than `step` (all when None) and unfinished saves: never agreed on."""
        for committed in self.committed_steps():
            if step is None or committed > step:
                shutil.rmtree(self._step_dir(committed), ignore_errors=True)
        for leftover in self.directory.glob(f"{_PREFIX}*{_TMP}"):
            shutil.rmtree(leftover, ignore_errors=True)

    def close(self) -> None:
        self._writer.shutdown(wait=True)
