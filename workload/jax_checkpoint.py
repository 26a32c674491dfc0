"""Checkpoints of a sharded JAX train state through the local tier.

Each host saves only the shards it holds (its addressable shards) into its own local tier, so no
host waits on another to save and a host's copy survives a restart of the job. The blocking part
of a save is the copy of those shards to host memory; writing happens on a background thread.
The supervisor learns a step is committed through `checkpoint_saved`, and at restart tells every
host which step all of them hold (`restore_step`).
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import jax
import numpy as np
from slicekeeper.workload.local_tier import LocalTier, Shards
from slicekeeper.workload.sdk import Session

from slicekeeper.protocol import Phase


def _index_key(index: tuple[slice, ...], shape: tuple[int, ...]) -> str:
    """A stable name for a shard's position in the global array, e.g. `0-256_64-128`."""
    parts = []
    for part, size in zip(index, shape, strict=True):
        start, stop, _ = part.indices(size)
        parts.append(f"{start}-{stop}")
    return "_".join(parts) or "scalar"


def host_shards(tree: Any) -> Shards:
    """{`leafNNNN/position`: numpy copy} for every distinct shard this process holds.

    A real copy: the training step donates the state's buffers, a view would change under us.
    """
    shards: Shards = {}
    for number, leaf in enumerate(jax.tree_util.tree_leaves(tree)):
        for shard in leaf.addressable_shards:
            name = f"leaf{number:04d}/{_index_key(shard.index, leaf.shape)}"
            if name not in shards:
                shards[name] = np.array(shard.data, copy=True)
    return shards


def _shard_reader(shards: Shards, number: int, shape: tuple[int, ...]) -> Callable[[Any], np.ndarray]:
    def read(index: Any) -> np.ndarray:
        return shards[f"leaf{number:04d}/{_index_key(index, shape)}"]

    return read


def from_host_shards(shards: Shards, target: Any) -> Any:
    """Rebuild global arrays laid out like `target` (ShapeDtypeStructs with shardings)."""
    leaves, treedef = jax.tree_util.tree_flatten(target)
    restored = []
    for number, leaf in enumerate(leaves):
        restored.append(
            jax.make_array_from_callback(leaf.shape, leaf.sharding, _shard_reader(shards, number, leaf.shape))
        )
    return jax.tree_util.tree_unflatten(treedef, restored)


def fingerprint(tree: Any) -> str:
    """sha256 over every leaf's shape, dtype and bytes: equal parameters, equal fingerprints."""
    from jax.experimental import multihost_utils

    digest = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(tree):
        full = np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        digest.update(f"{full.shape}{full.dtype}".encode())
        digest.update(np.ascontiguousarray(full).tobytes())
    return digest.hexdigest()


class JaxCheckpointer:
    """Saves every `interval` steps into this host's local tier; restores the agreed step."""

    def __init__(self, session: Session, directory: str | Path, interval: int, keep: int) -> None:
        self._session = session
        self._interval = interval
        self.tier = LocalTier(directory, keep)
        self._pending: list[tuple[int, Future[None]]] = []

    def restore(self, step: int | None, target: Any) -> Any | None:
        """Restore `step` into arrays laid out like `target`; None (a fresh start) when step is None.

        Local steps newer than the agreed one are dropped first: not every host holds them.
        """
        self.tier.discard_after(step)
        if step is None:
            return None
        with self._session.phase(Phase.CHECKPOINT_RESTORE):
            state = from_host_shards(self.tier.restore(step), target)
            jax.block_until_ready(state)
        self._session.checkpoint_restored(step, tier="local")
        return state

    def maybe_save(self, step: int, state: Any) -> None:
        """Report saves that finished since the last call; start a save when `step` is due."""
        self.poll()
        if step % self._interval:
            return
        with self._session.phase(Phase.CHECKPOINT_SAVE):
            shards = host_shards(state)  # the blocking part: device-to-host copy
        self._pending.append((step, self.tier.save_async(step, shards)))

    def poll(self) -> None:
        """Report every finished save; a failed one is reported as failed, never as committed."""
        while self._pending and self._pending[0][1].done():
            step, future = self._pending.pop(0)
            error = future.exception()
            if error is None:
                self._session.checkpoint_saved(step, tier="local")
            else:
                print(f"slicekeeper: local checkpoint of step {step} failed: {error!r}", file=sys.stderr)
                self._session.checkpoint_failed(step, tier="local", reason=repr(error))

    def close(self) -> None:
        self.tier.close()
        self.poll()
