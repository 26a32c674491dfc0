"""The reference trainer on fewer replicas: the same global batch, the same steps, float-close parameters.

A scaled-down job keeps the full job's global batch: the chunks of the missing replicas are
accumulated by the surviving ones (model.ChunkPlan). The JAX tests run in a subprocess, because the
number of fake CPU devices (XLA_FLAGS) must be set before JAX is imported, and they lay a (data,
model) mesh over the devices of one process instead of over processes: the same programs, the
same sharding.

Measured here (default model, 8 steps, full_hosts 4; parameters' max |difference| relative to the
leaf's max |value|): 2x2 and 3x2 against 4x2 differ by about 1.5e-7 (a float32 rounding or two) in a
fifth of the elements, losses by at most 1e-7 relative; after 120 steps below 1e-6, losses within
3e-7. The tolerance below leaves room for other CPUs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from slicekeeper.workload.reference.model import ChunkPlan

ROOT = Path(__file__).parents[2]
FULL_HOSTS = 4
STEPS = 8
TOLERANCE = 1e-5

# --- the chunk plan (pure) -------------------------------------------------------------------------


@pytest.mark.parametrize("replicas", [4, 2, 3, 1])
def test_every_chunk_of_the_global_batch_is_computed_exactly_once(replicas):
    plan = ChunkPlan(chunks=FULL_HOSTS, replicas=replicas)
    slots = [
        plan.chunk_at(micro_step, replica)
        for micro_step in range(plan.micro_steps)
        for replica in range(replicas)
    ]
    assert sorted(chunk for chunk in slots if chunk is not None) == list(range(FULL_HOSTS))
    assert plan.micro_steps == -(-FULL_HOSTS // replicas)
    for chunk in range(FULL_HOSTS):
        micro_step, replica = plan.slot(chunk)
        assert (micro_step, replica) == (chunk // replicas, chunk % replicas)
        assert plan.chunk_at(micro_step, replica) == chunk


@pytest.mark.parametrize("replicas", [4, 2, 3, 1])
def test_padding_slots_weigh_nothing_and_real_chunks_weigh_one(replicas):
    plan = ChunkPlan(chunks=FULL_HOSTS, replicas=replicas)
    weights = plan.weights()
    assert weights.shape == (plan.micro_steps, replicas)
    for micro_step in range(plan.micro_steps):
        for replica in range(replicas):
            real = plan.chunk_at(micro_step, replica) is not None
            assert weights[micro_step, replica] == (1.0 if real else 0.0)
    assert weights.sum() == FULL_HOSTS


def test_three_replicas_for_four_chunks_take_two_micro_steps_with_two_padding_slots():
    plan = ChunkPlan(chunks=4, replicas=3)
    assert plan.micro_steps == 2
    assert plan.weights().tolist() == [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]


@pytest.mark.parametrize("replicas", [4, 2, 3, 1])
def test_the_layout_puts_each_chunks_rows_in_its_slot_and_zeros_in_padding(replicas):
    plan = ChunkPlan(chunks=FULL_HOSTS, replicas=replicas)
    rows_per_chunk, width = 3, 5
    rows = np.arange(FULL_HOSTS * rows_per_chunk * width, dtype=np.int32).reshape(-1, width) + 1
    laid_out = plan.lay_out(rows)
    assert laid_out.shape == (plan.micro_steps, replicas, rows_per_chunk, width)
    for micro_step in range(plan.micro_steps):
        for replica in range(replicas):
            chunk = plan.chunk_at(micro_step, replica)
            expected = (
                np.zeros((rows_per_chunk, width), np.int32)
                if chunk is None
                else rows[chunk * rows_per_chunk : (chunk + 1) * rows_per_chunk]
            )
            np.testing.assert_array_equal(laid_out[micro_step, replica], expected)


def test_with_every_replica_present_each_computes_its_own_chunk_in_one_micro_step():
    plan = ChunkPlan(chunks=4, replicas=4)
    assert plan.micro_steps == 1
    assert [plan.slot(chunk) for chunk in range(4)] == [(0, 0), (0, 1), (0, 2), (0, 3)]


@pytest.mark.parametrize("replicas", [0, 5])
def test_a_plan_needs_between_one_replica_and_one_per_chunk(replicas):
    with pytest.raises(ValueError, match="replicas"):
        ChunkPlan(chunks=4, replicas=replicas)


def test_rows_that_do_not_split_into_the_chunks_are_refused():
    with pytest.raises(ValueError, match="chunks"):
        ChunkPlan(chunks=4, replicas=2).lay_out(np.zeros((6, 3), np.int32))


# --- restoring a host's shards ----------------------------------------------------------------------


def test_a_checkpoint_without_a_shard_the_mesh_needs_names_the_shard_and_the_step(tmp_path):
    import jax
    from slicekeeper.workload.jax_checkpoint import JaxCheckpointer, MissingShard
    from slicekeeper.workload.local_tier import LocalTier
    from slicekeeper.workload.sdk import connect

    from slicekeeper import protocol

    LocalTier(tmp_path, keep=3).save_async(20, {"leaf0000/0-2": np.zeros(2, np.float32)}).result()
    session = connect({protocol.ENV_CHECKPOINT_DIR: str(tmp_path)})
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {"w": jax.ShapeDtypeStruct((4,), np.float32, sharding=device)}
    with pytest.raises(MissingShard, match=r"step 20.*leaf0000/0-4.*leaf0000/0-2"):
        JaxCheckpointer(session).restore(20, target)


# --- the two-phase step on meshes of different sizes (subprocess) ----------------------------------

TRAIN = """
import json, sys
from pathlib import Path
import jax, numpy as np
from jax.sharding import Mesh
from slicekeeper.workload.reference.model import ModelConfig, ShardedModel

steps, full_hosts, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
losses = {}
for run in sys.argv[4:]:
    replicas = int(run.split("-")[0])
    devices = np.array(jax.devices()[: 2 * replicas]).reshape(replicas, 2)
    model = ShardedModel(ModelConfig(), Mesh(devices, ("data", "model")), full_hosts=full_hosts)
    model.compile()
    (out / f"{run}-local_grads.hlo").write_text(model._local_grads.as_text())
    (out / f"{run}-apply.hlo").write_text(model._apply.as_text())
    state = model.init_state(0)
    losses[run] = []
    for step in range(1, steps + 1):
        local = model.local_grads(state, model.global_batch(0, step))
        state, loss = model.apply(state, local)
        losses[run].append(loss)
    leaves = jax.tree_util.tree_flatten_with_path(state["params"])[0]
    np.savez(out / f"{run}.npz", **{jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves})
print(json.dumps(losses))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Train STEPS steps on 4x2, again on a fresh 4x2, on 2x2 and on 3x2 devices (data x model)."""
    out = tmp_path_factory.mktemp("elastic")
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
    }
    result = subprocess.run(
        [sys.executable, "-c", TRAIN, str(STEPS), str(FULL_HOSTS), str(out), "4", "4-again", "2", "3"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    losses = json.loads(result.stdout.splitlines()[-1])
    return {
        run: {"losses": losses[run], "params": dict(np.load(out / f"{run}.npz")), "hlo": out / run}
        for run in losses
    }


def largest_relative_difference(params: dict, reference: dict) -> float:
    """max over leaves of max |difference| / max |reference value|."""
    assert params.keys() == reference.keys()
    return max(
        float(np.max(np.abs(params[key] - reference[key])) / np.max(np.abs(reference[key])))
        for key in reference
    )


@pytest.mark.slow
def test_the_full_world_two_phase_step_is_deterministic(runs):
    assert runs["4-again"]["losses"] == runs["4"]["losses"]
    for key, value in runs["4"]["params"].items():
        np.testing.assert_array_equal(runs["4-again"]["params"][key], value)


@pytest.mark.slow
@pytest.mark.parametrize("run", ["2", "3"])
def test_fewer_replicas_train_on_the_same_batches_to_float_rounding(runs, run):
    full, scaled = runs["4"], runs[run]
    np.testing.assert_allclose(scaled["losses"], full["losses"], rtol=TOLERANCE)
    assert largest_relative_difference(scaled["params"], full["params"]) < TOLERANCE
    assert full["losses"][-1] < full["losses"][0]  # it trained at all


# The compiled programs name their collectives' device groups in one of several notations.
COLLECTIVE = re.compile(
    r"\b(?:all-reduce|all-gather|all-to-all|collective-permute|reduce-scatter)(?:-start)?\("
)
EXPLICIT = re.compile(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}")
PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")
IOTA = re.compile(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
MESH = re.compile(
    r"replica_groups=mesh\[([^\]]*)\](?:, device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\))? \{([^}]*)\}"
)


def _ints(text: str) -> list[int]:
    return [int(number) for number in text.split(",") if number]


def _iota(dims: str, transpose: str | None) -> np.ndarray:
    shape = _ints(dims)
    ids = np.arange(int(np.prod(shape))).reshape(shape)
    return ids.transpose(_ints(transpose)) if transpose else ids


def device_groups(instruction: str, devices: int) -> list[set[int]]:
    """The sets of devices that communicate in one collective instruction of an HLO module."""
    if match := PAIRS.search(instruction):
        return [set(_ints(pair)) for pair in re.findall(r"\{(\d+,\d+)\}", match.group(1))]
    if match := EXPLICIT.search(instruction):
        groups = [set(_ints(group)) for group in re.findall(r"\{([\d,]*)\}", match.group(1))]
        return groups or [set(range(devices))]  # no groups: every device
    if match := IOTA.search(instruction):
        size = _ints(match.group(1))
        return [set(row) for row in _iota(match.group(2), match.group(3)).reshape(size).tolist()]
    if match := MESH.search(instruction):
        axes = re.findall(r"'(\w+)'=(\d+)", match.group(1))
        names, sizes = [name for name, _ in axes], [int(size) for _, size in axes]
        ids = _iota(match.group(2), match.group(3)) if match.group(2) else np.arange(devices)
        grid = ids.reshape(sizes)
        grouped = [names.index(name) for name in re.findall(r"'(\w+)'", match.group(4))]
        kept = [axis for axis in range(len(names)) if axis not in grouped]
        group_size = int(np.prod([sizes[axis] for axis in grouped]))
        return [set(row) for row in grid.transpose(kept + grouped).reshape(-1, group_size).tolist()]
    raise AssertionError(f"a collective with device groups in an unknown notation: {instruction}")


def collective_groups(hlo: Path, devices: int) -> list[set[int]]:
    lines = [line for line in hlo.read_text().splitlines() if COLLECTIVE.search(line)]
    return [group for line in lines for group in device_groups(line, devices)]


@pytest.mark.slow
def test_local_gradients_communicate_only_within_a_host_and_apply_across_hosts(runs):
    """Device 2r and 2r + 1 are data replica r's (one host's) `model` devices."""
    base = runs["4"]["hlo"]
    local = collective_groups(base.with_name(f"{base.name}-local_grads.hlo"), devices=8)
    apply = collective_groups(base.with_name(f"{base.name}-apply.hlo"), devices=8)
    assert local, "the model axis communicates within a host: the parser must see those collectives"
    assert all(len(replicas_in(group)) == 1 for group in local)
    assert any(len(replicas_in(group)) > 1 for group in apply)  # the all-reduce over `data`


def replicas_in(group: set[int]) -> set[int]:
    return {device // 2 for device in group}
