"""The reference trainer on fewer slices: the same global batch, the same steps, float-close parameters.

A scaled-down job keeps the full job's global batch: the chunks of the missing hosts are
accumulated by the surviving ones (model.ChunkPlan). The JAX tests run in a subprocess, because the
number of fake CPU devices (XLA_FLAGS) must be set before JAX is imported, and they lay the
(replica, fsdp, model) mesh over the devices of one process instead of over processes: the same
programs, the same sharding. A run is named `RxFxM-of-N`: R slices of F hosts of M devices, the
global batch sized for N hosts.

Measured here (default model, 8 steps; parameters' max |difference| relative to the leaf's max
|value|): one slice of 2x2 against two differs by about 1.4e-7 (a float32 rounding or two), losses
by at most 5e-7 absolute; the tolerance below leaves room for other CPUs.
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

from tests.support.xla_flags import with_cheap_compile

ROOT = Path(__file__).parents[2]
FULL_HOSTS = 4
STEPS = 8
TOLERANCE = 1e-5

# --- the chunk plan (pure) -------------------------------------------------------------------------


@pytest.mark.parametrize("hosts", [4, 2, 3, 1])
def test_every_chunk_of_the_global_batch_is_computed_exactly_once(hosts):
    plan = ChunkPlan(chunks=FULL_HOSTS, host_count=hosts)
    slots = [
        plan.chunk_at(micro_step, host) for micro_step in range(plan.micro_steps) for host in range(hosts)
    ]
    assert sorted(chunk for chunk in slots if chunk is not None) == list(range(FULL_HOSTS))
    assert plan.micro_steps == -(-FULL_HOSTS // hosts)
    for chunk in range(FULL_HOSTS):
        micro_step, host = plan.slot(chunk)
        assert (micro_step, host) == (chunk // hosts, chunk % hosts)
        assert plan.chunk_at(micro_step, host) == chunk


@pytest.mark.parametrize("hosts", [4, 2, 3, 1])
def test_padding_slots_weigh_nothing_and_real_chunks_weigh_one(hosts):
    plan = ChunkPlan(chunks=FULL_HOSTS, host_count=hosts)
    weights = plan.weights()
    assert weights.shape == (plan.micro_steps, hosts)
    for micro_step in range(plan.micro_steps):
        for host in range(hosts):
            real = plan.chunk_at(micro_step, host) is not None
            assert weights[micro_step, host] == (1.0 if real else 0.0)
    assert weights.sum() == FULL_HOSTS


def test_three_hosts_for_four_chunks_take_two_micro_steps_with_two_padding_slots():
    plan = ChunkPlan(chunks=4, host_count=3)
    assert plan.micro_steps == 2
    assert plan.weights().tolist() == [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]


@pytest.mark.parametrize("hosts", [4, 2, 3, 1])
def test_the_layout_puts_each_chunks_rows_in_its_slot_and_zeros_in_padding(hosts):
    plan = ChunkPlan(chunks=FULL_HOSTS, host_count=hosts)
    rows_per_chunk, width = 3, 5
    rows = np.arange(FULL_HOSTS * rows_per_chunk * width, dtype=np.int32).reshape(-1, width) + 1
    laid_out = plan.lay_out(rows)
    assert laid_out.shape == (plan.micro_steps, hosts, rows_per_chunk, width)
    for micro_step in range(plan.micro_steps):
        for host in range(hosts):
            chunk = plan.chunk_at(micro_step, host)
            expected = (
                np.zeros((rows_per_chunk, width), np.int32)
                if chunk is None
                else rows[chunk * rows_per_chunk : (chunk + 1) * rows_per_chunk]
            )
            np.testing.assert_array_equal(laid_out[micro_step, host], expected)


def test_with_every_host_present_each_computes_its_own_chunk_in_one_micro_step():
    plan = ChunkPlan(chunks=4, host_count=4)
    assert plan.micro_steps == 1
    assert [plan.slot(chunk) for chunk in range(4)] == [(0, 0), (0, 1), (0, 2), (0, 3)]


@pytest.mark.parametrize("hosts", [0, 5])
def test_a_plan_needs_between_one_host_and_one_per_chunk(hosts):
    with pytest.raises(ValueError, match="hosts"):
        ChunkPlan(chunks=4, host_count=hosts)


def test_rows_that_do_not_split_into_the_chunks_are_refused():
    with pytest.raises(ValueError, match="chunks"):
        ChunkPlan(chunks=4, host_count=2).lay_out(np.zeros((6, 3), np.int32))


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
from slicekeeper.workload.jax_checkpoint import host_shards
from slicekeeper.workload.reference.model import AXES, ShardedModel
from slicekeeper.workload.reference.transformer import ModelConfig

steps, out = int(sys.argv[1]), Path(sys.argv[2])
losses, shards = {}, {}
for run in sys.argv[3:]:
    shape, full_hosts = run.split("-of-")
    slices, per_slice, per_host = map(int, shape.split("x"))
    devices = np.array(jax.devices()[: slices * per_slice * per_host])
    mesh = Mesh(devices.reshape(slices, per_slice, per_host), AXES)
    model = ShardedModel(ModelConfig(), mesh, full_hosts=int(full_hosts.split("-")[0]))
    model.compile()
    (out / f"{run}-local_grads.hlo").write_text(model._local_grads.as_text())
    (out / f"{run}-apply.hlo").write_text(model._apply.as_text())
    state = model.init_state(0)
    params = model.gather(state["params"])
    losses[run] = []
    for step in range(1, steps + 1):
        local = model.local_grads(params, model.global_batch(0, step))
        state, params, loss = model.apply(state, local)
        losses[run].append(loss)
    leaves = jax.tree_util.tree_flatten_with_path(state["params"])[0]
    np.savez(out / f"{run}.npz", **{jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves})
    # Each device's shard names: what a host at that device would save (host = device // per_host).
    shards[run] = {}
    for leaf in jax.tree_util.tree_leaves(state):
        for shard in leaf.addressable_shards:
            names = shards[run].setdefault(str(shard.device.id // per_host), [])
            names.append(f"{leaf.shape}{shard.index}")
print(json.dumps({"losses": losses, "shards": shards}))
"""

FULL = f"2x2x2-of-{FULL_HOSTS}"
"""Two slices of two hosts of two devices: the example job's shape."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Train STEPS steps on the full job twice, on one slice of it, and on 3, 2 and 1 slices of a
    six-host job of one device per host (3 hosts for 6 chunks: padding slots)."""
    out = tmp_path_factory.mktemp("elastic")
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": with_cheap_compile("--xla_force_host_platform_device_count=8"),
    }
    names = [FULL, f"{FULL}-again", f"1x2x2-of-{FULL_HOSTS}", "3x2x1-of-6", "2x2x1-of-6", "1x2x1-of-6"]
    result = subprocess.run(
        [sys.executable, "-c", TRAIN, str(STEPS), str(out), *names],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[-1])
    return {
        run: {
            "losses": found["losses"][run],
            "params": dict(np.load(out / f"{run}.npz")),
            "shards": found["shards"][run],
            "hlo": out / run,
        }
        for run in names
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
    assert runs[f"{FULL}-again"]["losses"] == runs[FULL]["losses"]
    for key, value in runs[FULL]["params"].items():
        np.testing.assert_array_equal(runs[f"{FULL}-again"]["params"][key], value)


@pytest.mark.slow
@pytest.mark.parametrize(("run", "full"), [(f"1x2x2-of-{FULL_HOSTS}", FULL), ("2x2x1-of-6", "3x2x1-of-6")])
def test_fewer_slices_train_on_the_same_batches_to_float_rounding(runs, run, full):
    full, scaled = runs[full], runs[run]
    np.testing.assert_allclose(scaled["losses"], full["losses"], rtol=TOLERANCE)
    assert largest_relative_difference(scaled["params"], full["params"]) < TOLERANCE
    assert full["losses"][-1] < full["losses"][0]  # it trained at all


@pytest.mark.slow
def test_a_single_slice_of_single_device_hosts_trains_what_three_slices_train(runs):
    np.testing.assert_allclose(runs["1x2x1-of-6"]["losses"], runs["3x2x1-of-6"]["losses"], rtol=TOLERANCE)


@pytest.mark.slow
def test_each_host_holds_a_shard_of_its_own_within_its_slice_and_its_twin_holds_the_same(runs):
    """The point of the layout: a host's checkpoint is not the whole model, and not any other host
    of its slice's; only the same worker in another slice (its twin) holds the same positions."""
    shards = runs[FULL]["shards"]  # hosts 0, 1 (slice 0) and 2, 3 (slice 1)
    for host in ("0", "1", "2", "3"):
        mine = set(shards[host])
        for other in ("0", "1", "2", "3"):
            if other == host:
                continue
            twin = int(other) % 2 == int(host) % 2
            if twin:
                assert set(shards[other]) == mine
            else:
                # only replicated scalars (the optimizer's step counters) are shared
                shared = mine & set(shards[other])
                assert shared and all(name.startswith("()") for name in shared), shared
    # a scaled-down world keeps every host's positions: it restores its own shards
    assert runs[f"1x2x2-of-{FULL_HOSTS}"]["shards"] == {h: shards[h] for h in ("0", "1")}


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
def test_local_gradients_communicate_only_within_a_host_and_apply_across_hosts_and_slices(runs):
    """In 2x2x2, devices 2h and 2h + 1 are host h's `model` devices; hosts 0, 1 are slice 0."""
    base = runs[FULL]["hlo"]
    local = collective_groups(base.with_name(f"{base.name}-local_grads.hlo"), devices=8)
    apply = collective_groups(base.with_name(f"{base.name}-apply.hlo"), devices=8)
    assert local, "the model axis communicates within a host: the parser must see those collectives"
    assert all(len(hosts_in(group)) == 1 for group in local)
    assert any(len(hosts_in(group)) > 1 for group in apply)
    assert any(len({host // 2 for host in hosts_in(group)}) > 1 for group in apply)  # across slices


@pytest.mark.slow
def test_apply_gathers_every_parameter_over_the_slice_in_one_collective(runs):
    """FSDP's all-gather of the 15 parameters is one collective across hosts
    (`ShardedModel._gather_over_slice`); left to XLA it was 15, one a parameter, each a round of
    messages between the hosts' processes."""
    base = runs[FULL]["hlo"]
    hlo = base.with_name(f"{base.name}-apply.hlo").read_text().splitlines()
    gathers = [line for line in hlo if re.search(r"\ball-gather(?:-start)?\(", line)]
    across = [line for line in gathers if any(len(hosts_in(group)) > 1 for group in device_groups(line, 8))]
    assert len(across) == 1, across


def hosts_in(group: set[int]) -> set[int]:
    return {device // 2 for device in group}
