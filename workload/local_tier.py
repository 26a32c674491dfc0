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

import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from slicekeeper import shard_folder
from slicekeeper.shard_folder import CorruptCheckpoint, Layout, Manifest, ShardFile

Shards = dict[str, np.ndarray]
"""Flat mapping of a shard's name (leaf and position) to its data."""

__all__ = ["CorruptCheckpoint", "LocalTier", "Shards"]


class LocalTier:
    """One host's local tier directory: async atomic saves, verified restores, retention."""

    def __init__(self, directory: str | Path, keep: int) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._keep = keep
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="slicekeeper-local-tier")

    def _step_dir(self, step: int) -> Path:
        return shard_folder.step_dir(self.directory, step)

    def committed_steps(self) -> list[int]:
        return shard_folder.committed_steps(self.directory)

    def save_async(self, step: int, shards: Shards, layout: Layout | None = None) -> Future[None]:
        """Write `shards` for `step` in the background (`layout`: what its leaves are, kept in the
        manifest); the future fails if the save did."""
        return self._writer.submit(self._write, step, shards, layout)

    def _write(self, step: int, shards: Shards, layout: Layout | None) -> None:
        tmp = shard_folder.tmp_dir(self.directory, step)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        entries = []
        for number, (name, array) in enumerate(sorted(shards.items())):
            file = tmp / f"{number:05d}.npy"
            with file.open("wb") as out:
                np.save(out, array, allow_pickle=False)
                out.flush()
                os.fsync(out.fileno())
            entries.append(ShardFile(name, file.name, shard_folder.sha256_file(file), file.stat().st_size))
        shard_folder.write_manifest(tmp, Manifest(step, tuple(entries), layout))
        shard_folder.commit(tmp, self._step_dir(step))
        shard_folder.retain(self.directory, self._keep)

    def restore(self, step: int, verify: bool = True) -> Shards:
        """Read every shard of `step`, verified (CorruptCheckpoint on any mismatch) unless the caller
        knows it was verified just before (`verify=False`: the manifest is still read and obeyed)."""
        folder = self._step_dir(step)
        manifest = shard_folder.verify(folder) if verify else shard_folder.read_manifest(folder)
        return {s.name: np.load(folder / s.file, allow_pickle=False) for s in manifest.shards}

    def quarantine(self, step: int) -> None:
        """Set a corrupt step aside (kept for a post-mortem, never listed or restored again)."""
        shard_folder.quarantine(self._step_dir(step))

    def discard_after(self, step: int | None) -> None:
        """Drop steps newer than `step` (all when None) and unfinished saves: never agreed on."""
        for committed in self.committed_steps():
            if step is None or committed > step:
                shutil.rmtree(self._step_dir(committed), ignore_errors=True)
        for leftover in self.directory.glob(f"{shard_folder.STEP_PREFIX}*{shard_folder.TMP_SUFFIX}"):
            shutil.rmtree(leftover, ignore_errors=True)

    def close(self) -> None:
        self._writer.shutdown(wait=True)
