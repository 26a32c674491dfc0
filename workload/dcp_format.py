"""Checkpoints in torch.distributed.checkpoint's format: what PyTorch users' own tools read.

`write` turns a whole step (workload.global_arrays) into a DCP directory: a plain `dcp.load` into
a state dict of the same keys, `{"step": 0, "model": {...}, "optim": {...}}`, fills it, in any world
size (tensors, or DTensors sharded over the loading job's mesh: DCP reads each rank's part).
`load_into` is that load, for the first generation of a job started with `spec.workload.initFrom`.

Keys are the leaves' paths split at `/`, so `model/layers/0/qkv` is the DCP key
`model.layers.0.qkv`. The tiers do not use DCP; it is used only at these two edges.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist
from slicekeeper.workload.global_arrays import GlobalCheckpoint, nest
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save


def write(checkpoint: GlobalCheckpoint, destination: Path) -> None:
    """Write `checkpoint` as a DCP directory at `destination`, from this one process."""
    state = nest(
        {"step": checkpoint.step, **{path: torch.from_numpy(a) for path, a in checkpoint.arrays.items()}}
    )
    dcp_save(state, checkpoint_id=destination, no_dist=True)


def load_into(location: str, tensors: Mapping[str, torch.Tensor]) -> int:
    """Fill `tensors` ({path: tensor or DTensor}, e.g. this host's rows as DTensors on the job's mesh)
    in place from the DCP checkpoint at `location`; return its step. A collective when a process
    group is initialized: every rank calls it."""
    state = nest({"step": -1, **tensors})
    try:
        dcp_load(state, checkpoint_id=location, no_dist=not dist.is_initialized())
    except Exception as error:  # DCP raises CheckpointException, RuntimeError, FileNotFoundError
        raise ValueError(
            f"spec.workload.initFrom {location}: not a torch.distributed.checkpoint of this job's state "
            f"({error})"
        ) from error
    step = state["step"]
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"spec.workload.initFrom {location}: the checkpoint holds no step")
    return step
