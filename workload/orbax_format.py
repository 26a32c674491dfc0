"""Checkpoints in orbax's format: what JAX users' own tools (MaxText, any orbax restore) read.

`write` turns a whole step (workload.global_arrays) into an orbax checkpoint of global arrays: a
plain `orbax.checkpoint.StandardCheckpointer().restore(path)` gives back nested dicts of numpy
arrays, `{"step": ..., "params": {...}, "opt": {...}}`, with no slicekeeper code. `restore_onto`
reads such a checkpoint into a sharded JAX state (the first generation of a job started with
`spec.workload.initFrom`): orbax reads on each process only the parts its devices hold, so the
checkpoint is resharded onto whatever mesh the job has.

The tiers do not use orbax (workload.local_tier says why); it is used only at these two edges.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
from slicekeeper.workload.global_arrays import GlobalCheckpoint, nest


def write(checkpoint: GlobalCheckpoint, destination: Path) -> None:
    """Write `checkpoint` as an orbax checkpoint at `destination` (a new directory)."""
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(destination.absolute(), checkpoint.tree())


def _paths(target: Any) -> tuple[list[str], list[Any], Any]:
    flat, treedef = jax.tree_util.tree_flatten_with_path(target)
    paths = [jax.tree_util.keystr(path, simple=True, separator="/") for path, _ in flat]
    return paths, [leaf for _, leaf in flat], treedef


def restore_onto(location: str, target: Any) -> tuple[Any, int]:
    """(the state, its step) from the orbax checkpoint at `location`, laid out like `target` (a tree
    of ShapeDtypeStructs with shardings, e.g. the abstract train state). Its leaves are found by their
    paths in `target` (`params/layers/0/qkv`). A collective: every process of the job calls it."""
    import orbax.checkpoint as ocp

    if "://" not in location:
        location = os.path.abspath(location)  # orbax takes absolute paths only
    paths, leaves, treedef = _paths(target)
    abstract = nest({"step": np.zeros((), np.int64), **dict(zip(paths, leaves, strict=True))})
    try:
        restored = ocp.StandardCheckpointer().restore(location, abstract)
    except (KeyError, ValueError, FileNotFoundError) as error:
        raise ValueError(
            f"spec.workload.initFrom {location}: not an orbax checkpoint of this job's state ({error})"
        ) from error
    values = []
    for path in paths:
        node = restored
        for part in path.split("/"):
            node = node[part]
        values.append(node)
    return jax.tree_util.tree_unflatten(treedef, values), int(restored["step"])
