"""Checkpoints of a data-parallel PyTorch loop's state through the local tier.

In a DistributedDataParallel loop every host holds the whole model and optimizer state, so each
host saves all of it into its own local tier (the supervisor copies it to a peer and the persistent
tier, like any shard folder). The SDK's Checkpointer stores named numpy arrays; these two functions
turn a model's and an optimizer's state into such arrays and back, step by step consistent: the
optimizer's moments and step count travel in the same shard folder as the weights, so a restore of
step 35 never mixes step 35's weights with step 40's moments.

A sharded loop (FSDP, DTensor) saves each host's own shards instead, named by their position in the
global array (the reference trainer's torch_sharded.py shows how). Saved: the model's state dict and
the optimizer's per-parameter state (tensors and numbers). Not saved: the optimizer's
hyper-parameters (the loop builds them again) and a learning-rate scheduler's state (derive it from
the step, as the reference trainers do). bfloat16 tensors, which numpy cannot hold, are refused.
"""

from __future__ import annotations

import numpy as np
import torch
from slicekeeper.workload.local_tier import Shards

MODEL, OPTIMIZER = "model", "optimizer"


def state_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Shards:
    """{`model/<name>`: weights, `optimizer/<index>/<key>`: the optimizer's per-parameter state}, as
    numpy copies (the loop goes on changing its tensors while the write runs)."""
    shards: Shards = {f"{MODEL}/{name}": _array(name, value) for name, value in model.state_dict().items()}
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            name = f"{OPTIMIZER}/{index}/{key}"
            if isinstance(value, torch.Tensor):
                shards[name] = _array(name, value)
            elif isinstance(value, (int, float)):
                shards[name] = np.asarray(value)
            else:
                raise TypeError(f"{name}: optimizer state of type {type(value).__name__} cannot be saved")
    return shards


def _array(name: str, value: torch.Tensor) -> np.ndarray:
    if value.dtype == torch.bfloat16:
        raise TypeError(f"{name}: bfloat16 has no numpy type; keep the state in float32 to save it")
    return value.detach().cpu().numpy().copy()


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
