"""Checkpoints of a data-parallel PyTorch loop's state through the local tier.

In a DistributedDataParallel loop every host holds the whole model and optimizer state, so each
host saves all of it into its own local tier (the supervisor copies it to a peer and the persistent
tier, like any shard folder). The SDK's Checkpointer stores named numpy arrays; these two functions
turn a model's and an optimizer's state into such arrays and back, step by step consistent: the
optimizer's moments and step count travel in the same shard folder as the weights, so a restore of
step 35 never mixes step 35's weights with step 40's moments.

A sharded loop (FSDP, DTensor) saves each host's own shards instead, named by their position in the
global array (the reference trainer's torch_sharded.py shows how).
"""

from __future__ import annotations

import numpy as np
import torch
from slicekeeper.workload.local_tier import Shards

MODEL, OPTIMIZER = "model", "optimizer"


def state_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Shards:
    """{`model/<name>`: weights, `optimizer/<index>/<key>`: the optimizer's per-parameter state}, as
    numpy copies (the loop goes on changing its tensors while the write runs)."""
    shards: Shards = {
        f"{MODEL}/{name}": value.detach().cpu().numpy().copy() for name, value in model.state_dict().items()
    }
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
            shards[f"{OPTIMIZER}/{index}/{key}"] = array.copy()
    return shards


def load_state_shards(shards: Shards, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load what `state_shards` saved into `model` and `optimizer` (their hyper-parameters stay the
    ones the loop built them with)."""
    weights = {
        name.removeprefix(f"{MODEL}/"): torch.from_numpy(np.array(value))
        for name, value in shards.items()
        if name.startswith(f"{MODEL}/")
    }
    model.load_state_dict(weights)
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in shards.items():
        if name.startswith(f"{OPTIMIZER}/"):
            _, index, key = name.split("/", 2)
            state.setdefault(int(index), {})[key] = torch.from_numpy(np.array(value))
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})
