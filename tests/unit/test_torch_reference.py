"""The PyTorch pieces on their own: the reference trainer's learning-rate schedule and optimizer are
the JAX trainer's (optax's, checked against optax), its checkpoint shards round-trip exactly and name
what is missing, and a DDP loop's state round-trips through the SDK's torch_checkpoint. The
distributed behaviour (every fault kind, scaling) is tests/chaos/test_torch_recovery.py.
"""

from __future__ import annotations

import sys
import tempfile
import types
from collections.abc import Iterator

import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch.distributed as dist
from slicekeeper.workload.reference import torch_model, torch_trainer
from slicekeeper.workload.reference.batches import ModelConfig
from slicekeeper.workload.reference.torch_sharded import MissingShard, ShardedTorchModel, host_mesh
from slicekeeper.workload.torch_checkpoint import load_state_shards, state_shards

CONFIG = ModelConfig()


def optax_schedule() -> optax.Schedule:
    """The JAX trainer's schedule (transformer.optimizer): what the torch trainer must follow."""
    peak = CONFIG.learning_rate
    return optax.warmup_cosine_decay_schedule(
        0.0, peak, torch_model.WARMUP_STEPS, torch_model.DECAY_STEPS, 0.1 * peak
    )


@pytest.mark.parametrize("count", [0, 1, 7, 19, 20, 21, 500, 1999, 2000, 5000])
def test_the_schedule_is_optaxs_warmup_cosine_decay(count):
    schedule = optax_schedule()
    assert torch_model.learning_rate(CONFIG, count) == pytest.approx(
        float(schedule(count)), rel=1e-5, abs=1e-9
    )


def test_three_updates_match_optaxs_clipped_adamw():
    rng = np.random.default_rng(0)
    params = {"a": rng.normal(size=(4, 3)).astype(np.float32), "b": rng.normal(size=(5,)).astype(np.float32)}
    steps = [
        {name: rng.normal(size=value.shape).astype(np.float32) * 3 for name, value in params.items()}
        for _ in range(3)
    ]
    schedule = optax_schedule()
    tx = optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=torch_model.WEIGHT_DECAY)
    )
    theirs = {name: jnp.asarray(value) for name, value in params.items()}
    state = tx.init(theirs)
    ours = {name: torch.from_numpy(value.copy()) for name, value in params.items()}
    adam = torch_model.AdamWShard.zeros_like(ours)
    for grads in steps:
        updates, state = tx.update({n: jnp.asarray(g) for n, g in grads.items()}, state, theirs)
        theirs = optax.apply_updates(theirs, updates)
        torch_grads = {name: torch.from_numpy(g) for name, g in grads.items()}
        scale = torch_model.clip_factor(torch_grads)
        ours = adam.update(CONFIG, ours, {name: g * scale for name, g in torch_grads.items()})
    for name in params:
        np.testing.assert_allclose(ours[name].numpy(), np.asarray(theirs[name]), rtol=1e-5, atol=1e-7)


@pytest.fixture
def one_host() -> Iterator[ShardedTorchModel]:
    """The model on a world of one process (gloo, a file store): one slice of one host."""
    with tempfile.NamedTemporaryFile() as store:
        dist.init_process_group("gloo", init_method=f"file://{store.name}", rank=0, world_size=1)
        try:
            yield ShardedTorchModel(CONFIG, host_mesh(1), full_hosts=2)
        finally:
            dist.destroy_process_group()


def test_a_hosts_checkpoint_shards_restore_its_state_exactly(one_host):
    state = one_host.init_state(seed=3)
    params = one_host.gather(state.shard)
    local = one_host.local_grads(params, seed=3, step=1)
    state, params, loss = one_host.apply(state, local)
    assert np.isfinite(loss) and state.opt.count == 1
    restored = one_host.from_host_shards(one_host.host_shards(state))
    assert restored.opt.count == 1
    for name in one_host.shapes:
        assert torch.equal(restored.shard[name], state.shard[name])
        assert torch.equal(restored.opt.mu[name], state.opt.mu[name])
        assert torch.equal(restored.opt.nu[name], state.opt.nu[name])
    assert one_host.fingerprint(one_host.gather(restored.shard)) == one_host.fingerprint(params)


def test_a_missing_shard_is_named_with_what_the_checkpoint_holds(one_host):
    shards = one_host.host_shards(one_host.init_state(seed=0))
    missing = next(iter(shards))
    del shards[missing]
    with pytest.raises(MissingShard, match=f"no shard {missing} in this host's checkpoint"):
        one_host.from_host_shards(shards)


def test_a_ddp_loops_model_and_optimizer_state_round_trip_through_shards():
    """slicekeeper.workload.torch_checkpoint: weights and AdamW moments of one step, and nothing of
    the next (a restore never mixes steps)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def train_step() -> None:
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()

    train_step()
    train_step()
    saved = state_shards(model, optimizer)
    expected = {name: value.clone() for name, value in model.state_dict().items()}
    moments = {
        index: {k: v.clone() for k, v in s.items()} for index, s in optimizer.state_dict()["state"].items()
    }
    train_step()  # the loop goes on after the save

    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    load_state_shards(saved, fresh, fresh_optimizer)
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, expected[name]), name
    for index, state in fresh_optimizer.state_dict()["state"].items():
        for key, value in state.items():
            assert torch.equal(value, moments[index][key]), (index, key)
    assert all(name.startswith(("model/", "optimizer/")) for name in saved)


def test_the_tpu_path_is_taken_only_on_a_tpu_host_and_never_falls_back_silently(monkeypatch):
    """torch_xla is imported only with PJRT_DEVICE=TPU; there, without it, the trainer stops with the
    reason instead of training on the CPU. With a stand-in torch_xla the TPU path is chosen."""
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    assert torch_trainer.xla_runtime() is None
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    monkeypatch.setitem(sys.modules, "torch_xla", None)  # not importable
    with pytest.raises(SystemExit, match="PJRT_DEVICE=TPU, but torch_xla cannot be imported"):
        torch_trainer.xla_runtime()
    stand_in = types.ModuleType("torch_xla")
    for name in ("torch_xla.distributed", "torch_xla.distributed.xla_backend"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "torch_xla", stand_in)
    assert torch_trainer.xla_runtime() is stand_in
