"""Whole arrays from the hosts' shard folders of one step: what an export writes in a standard format.

Every host saves only its own part of each leaf, named by its position in the global array
(slicekeeper.shard_folder). Put together, the folders of one step (every host's, or a twin's in its
place) cover every element of every leaf exactly: this module puts them back into one numpy array per
leaf, named by its path in the training state (the manifest's layout). Twins hold the same positions;
their copies must agree, and a position no folder holds is an error that names the leaf, never a
silently zero-filled array.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from slicekeeper import shard_folder
from slicekeeper.errors import UserError
from slicekeeper.shard_folder import Layout, LeafLayout


class IncompleteCheckpoint(UserError):
    """The folders of a step do not hold every part of every leaf, or they disagree."""


@dataclass(frozen=True)
class GlobalCheckpoint:
    """One step of a training state, whole: every leaf's global array under its path, in leaf order."""

    step: int
    framework: str
    arrays: dict[str, np.ndarray]

    def tree(self) -> dict[str, object]:
        """The arrays as nested dicts split at `/` (`params/layers/0/qkv`), with the step at the top:
        the tree an export writes."""
        return nest({"step": np.asarray(self.step, np.int64), **self.arrays})


def nest(flat: Mapping[str, object]) -> dict[str, object]:
    """{`a/b/c`: value} -> {"a": {"b": {"c": value}}}."""
    tree: dict[str, object] = {}
    for path, value in flat.items():
        node = tree
        *parents, name = path.split("/")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"leaf path {path!r} passes through the leaf {part!r}")
            node = child
        node[name] = value
    return tree


def position(name: str, shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The part of the global array a shard holds, from its name (`leaf0003/0-64_0-128`)."""
    where = name.split("/", 1)[1] if "/" in name else ""
    if where == "scalar":
        return ()
    try:
        bounds = [tuple(int(n) for n in part.split("-")) for part in where.split("_")]
        index = tuple(slice(start, stop) for start, stop in bounds)
    except ValueError:
        raise IncompleteCheckpoint(f"shard {name!r}: its name does not say its position") from None
    if len(index) != len(shape) or any(
        not 0 <= part.start < part.stop <= size for part, size in zip(index, shape, strict=False)
    ):
        raise IncompleteCheckpoint(f"shard {name!r} lies outside its leaf's global shape {shape}")
    return index


def assemble(folders: Iterable[Path], verified: bool = False) -> GlobalCheckpoint:
    """The whole state of one step from its shard folders, each re-hashed against its manifest
    unless the caller just did (`verified`). Raises IncompleteCheckpoint for a part no folder holds,
    copies of a part that differ, folders of different steps, or folders without a layout."""
    read = shard_folder.read_manifest if verified else shard_folder.verify
    manifests = [(folder, read(folder)) for folder in folders]
    if not manifests:
        raise IncompleteCheckpoint("no shard folders to put together")
    steps = {manifest.step for _, manifest in manifests}
    if len(steps) != 1:
        raise IncompleteCheckpoint(f"the folders hold different steps: {sorted(steps)}")
    layout = _one_layout([(folder, manifest.layout) for folder, manifest in manifests])
    arrays: dict[str, np.ndarray] = {}
    covered: dict[str, np.ndarray] = {}
    leaves = {leaf.key: leaf for leaf in layout.leaves}
    for leaf in layout.leaves:
        arrays[leaf.path] = np.zeros(leaf.shape, np.dtype(leaf.dtype))
        covered[leaf.path] = np.zeros(leaf.shape, bool)
    for folder, manifest in manifests:
        for shard in manifest.shards:
            owner = leaves.get(shard.name.split("/", 1)[0])
            if owner is None:
                raise IncompleteCheckpoint(f"{folder}: shard {shard.name!r} belongs to no leaf of the layout")
            _place(owner, shard.name, np.load(folder / shard.file, allow_pickle=False), arrays, covered)
    for leaf in layout.leaves:
        missing = int((~covered[leaf.path]).sum())
        if missing:
            raise IncompleteCheckpoint(
                f"leaf {leaf.path} {leaf.shape}: {missing} of {covered[leaf.path].size} elements are in no "
                "host's shard folder (a host's shard of this step is missing from every tier)"
            )
    return GlobalCheckpoint(steps.pop(), layout.framework, arrays)


def _one_layout(layouts: list[tuple[Path, Layout | None]]) -> Layout:
    for folder, layout in layouts:
        if layout is None:
            raise IncompleteCheckpoint(
                f"{folder}: the manifest says nothing of what its leaves are (no layout): it was saved "
                "by a loop that gave the SDK's Checkpointer no layout, so its arrays have no names"
            )
    first_folder, first = layouts[0]
    for folder, layout in layouts[1:]:
        if layout != first:
            raise IncompleteCheckpoint(f"{folder} and {first_folder} describe different training states")
    assert first is not None
    return first


def _place(
    leaf: LeafLayout,
    name: str,
    data: np.ndarray,
    arrays: dict[str, np.ndarray],
    covered: dict[str, np.ndarray],
) -> None:
    index: tuple[Any, ...] = (*position(name, leaf.shape), ...)  # the Ellipsis: a view even of 0-d
    target = arrays[leaf.path][index]
    if data.shape != target.shape:
        raise IncompleteCheckpoint(f"shard {name}: shape {data.shape}, its position holds {target.shape}")
    seen = covered[leaf.path][index]
    if seen.any() and not np.array_equal(target[seen], data[seen]):
        raise IncompleteCheckpoint(
            f"shard {name} of leaf {leaf.path}: two hosts' copies differ (replicas that diverged)"
        )
    arrays[leaf.path][index] = data
    covered[leaf.path][index] = True
