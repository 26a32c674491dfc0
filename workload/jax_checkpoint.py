"""Checkpoints of a sharded JAX train state through the local tier.

Each host saves only the shards it holds (its addressable shards) into its own local tier, so no
host waits on another to save and a host's copy survives a restart of the job. The blocking part
of a save is the copy of those shards to host memory; writing happens on a background thread
(workload.checkpointing), and restores rebuild the global arrays on the current mesh.

Shards are named by their position in the global array, not by process. A state split over the
hosts of a slice and replicated over slices gives each host positions of its own within its slice,
shared only with its twins (the same worker in the other slices, holding the same values): a host
restores its own shards, or a twin's, and never another host's, which have other names. When the
job shrinks or grows by whole slices a host's positions do not change, so it restores its own
shards in any world size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from slicekeeper.workload.checkpointing import Checkpointer
from slicekeeper.workload.local_tier import Shards
from slicekeeper.workload.sdk import Session

from slicekeeper.shard_folder import Layout, LeafLayout


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


def layout_of(tree: Any) -> Layout:
    """What `host_shards(tree)`'s leaves are: each one's path in the tree (`params/layers/0/qkv`),
    global shape and dtype, kept in every manifest so an export can name the arrays."""
    return Layout(
        "jax",
        tuple(
            LeafLayout(
                f"leaf{number:04d}",
                jax.tree_util.keystr(path, simple=True, separator="/"),
                tuple(leaf.shape),
                np.dtype(leaf.dtype).name,
            )
            for number, (path, leaf) in enumerate(jax.tree_util.tree_flatten_with_path(tree)[0])
        ),
    )


class MissingShard(LookupError):
    """The checkpoint has no shard at a position the current mesh asks this host for."""


def _shard_reader(shards: Shards, number: int, shape: tuple[int, ...]) -> Callable[[Any], np.ndarray]:
    def read(index: Any) -> np.ndarray:
        key = f"leaf{number:04d}/{_index_key(index, shape)}"
        if key not in shards:
            held = sorted(name for name in shards if name.startswith(f"leaf{number:04d}/"))
            raise MissingShard(
                f"no shard {key} (global shape {shape}) in this host's checkpoint, which holds "
                f"{held or 'nothing'} for that leaf: was it saved with another model sharding?"
            )
        return shards[key]

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


def gather(tree: Any) -> dict[str, np.ndarray]:
    """Every leaf in full, keyed by its path in the tree (`layers/0/qkv`), in leaf order.

    A collective across processes: every process must call it.
    """
    from jax.experimental import multihost_utils

    return {
        jax.tree_util.keystr(path, simple=True, separator="/"): np.asarray(
            multihost_utils.process_allgather(leaf, tiled=True)
        )
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def local_copy(tree: Any) -> dict[str, np.ndarray]:
    """Every leaf in full from this process's own shards, keyed like `gather`; no communication.

    For a tree this process holds whole (e.g. parameters gathered over the hosts of its slice and
    split only over its own devices). A leaf it holds only part of raises ValueError: `gather` it.
    """
    copies = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        full = np.empty(leaf.shape, leaf.dtype)
        covered = np.zeros(leaf.shape, bool)
        for shard in leaf.addressable_shards:
            full[shard.index] = np.asarray(shard.data)
            covered[shard.index] = True
        if not covered.all():
            raise ValueError(f"{name}: this process holds only part of it; gather it instead")
        copies[name] = full
    return copies


def fingerprint_gathered(leaves: Mapping[str, np.ndarray]) -> str:
    """sha256 over every leaf's shape, dtype and bytes: equal parameters, equal fingerprints."""
    digest = hashlib.sha256()
    for full in leaves.values():
        digest.update(f"{full.shape}{full.dtype}".encode())
        digest.update(np.ascontiguousarray(full).tobytes())
    return digest.hexdigest()


def fingerprint(tree: Any) -> str:
    """The fingerprint of a sharded tree (a gather across processes, see `gather`)."""
    return fingerprint_gathered(gather(tree))


def host_digest(tree: Any) -> bytes:
    """sha256 over this process's own shards of `tree` (names, shapes, dtypes, bytes); no communication."""
    digest = hashlib.sha256()
    for name, shard in sorted(host_shards(tree).items()):
        digest.update(f"{name}{shard.shape}{shard.dtype}".encode())
        digest.update(np.ascontiguousarray(shard).tobytes())
    return digest.digest()


@dataclass(frozen=True)
class ReplicaAgreement:
    """Whether every slice holds the same state: what a gather of a replicated array cannot tell."""

    diverged: tuple[int, ...]
    """Slices whose copy differs from slice 0's (empty: every replica agrees)."""
    digest: str
    """sha256 over every host's digest of its own shards, in rank order: the same on every process."""


def replica_agreement(tree: Any, hosts_per_slice: int) -> ReplicaAgreement:
    """Compare every host's own shards of `tree` with its twins' (the same worker in other slices).

    A gather of a replicated array reads each process's local copy, so a slice whose hosts restored a
    wrong shard would go unnoticed in the fingerprint of the gathered values (or give each slice a
    fingerprint of its own). A collective across processes, ranked slice by slice: every process must
    call it.
    """
    from jax.experimental import multihost_utils

    mine = np.frombuffer(host_digest(tree), np.uint8)
    every = np.asarray(multihost_utils.process_allgather(mine, tiled=False))
    slices = every.reshape(-1, hosts_per_slice, every.shape[-1])
    diverged = tuple(index for index in range(1, len(slices)) if not np.array_equal(slices[index], slices[0]))
    return ReplicaAgreement(diverged, hashlib.sha256(every.tobytes()).hexdigest())


class JaxCheckpointer:
    """The local tier for a sharded JAX state: each host saves and restores only its own shards."""

    def __init__(self, session: Session) -> None:
        self._checkpointer = Checkpointer(session)

    def restore(self, step: int | None, target: Any) -> Any | None:
        """Restore `step` into arrays laid out like `target`; None (a fresh start) when step is None."""
        shards = self._checkpointer.restore(step)
        if shards is None:
            return None
        try:
            state = from_host_shards(shards, target)
        except MissingShard as error:
            raise MissingShard(f"restoring step {step}: {error}") from None
        jax.block_until_ready(state)
        return state

    def maybe_save(self, step: int, state: Any) -> None:
        if self._checkpointer.layout is None:
            self._checkpointer.layout = layout_of(state)
        self._checkpointer.maybe_save(step, lambda: host_shards(state))

    def close(self) -> None:
        self._checkpointer.close()
