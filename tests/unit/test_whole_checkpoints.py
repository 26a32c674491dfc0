"""Putting a step back together from the hosts' shard folders: every element from some host, copies
that agree, and a clear refusal (naming the leaf) when a part is missing, copies differ or the leaves
have no names; what `checkpoint list` says of a run directory's copies, a corrupt one included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from slicekeeper.supervisor.checkpoints.inventory import CheckpointSource, coverage, summarize
from slicekeeper.supervisor.plan import JobPlan
from slicekeeper.workload.global_arrays import IncompleteCheckpoint, assemble, nest
from slicekeeper.workload.local_tier import LocalTier

from slicekeeper import shard_folder
from slicekeeper.errors import UserError
from slicekeeper.shard_folder import Layout, LeafLayout, Manifest
from tests.support.plans import example_plan

LAYOUT = Layout(
    "jax",
    (
        LeafLayout("leaf0000", "params/w", (4, 3), "float32"),
        LeafLayout("leaf0001", "opt/count", (), "int32"),
    ),
)
WHOLE = np.arange(12, dtype=np.float32).reshape(4, 3)


def host_shards(host: int, whole: np.ndarray = WHOLE) -> dict[str, np.ndarray]:
    """Host `host` of a 2-host slice: its two rows of `w`, and the replicated counter."""
    rows = slice(2 * host, 2 * host + 2)
    return {f"leaf0000/{rows.start}-{rows.stop}_0-3": whole[rows].copy(), "leaf0001/scalar": np.int32(7)}


def save(
    directory: Path, shards: dict[str, np.ndarray], layout: Layout | None = LAYOUT, step: int = 5
) -> Path:
    tier = LocalTier(directory, keep=3)
    tier.save_async(step, shards, layout).result()
    tier.close()
    return shard_folder.step_dir(directory, step)


def test_the_hosts_folders_make_the_whole_state_under_its_paths(tmp_path):
    whole = assemble([save(tmp_path / "h0", host_shards(0)), save(tmp_path / "h1", host_shards(1))])
    assert whole.step == 5 and whole.framework == "jax"
    np.testing.assert_array_equal(whole.arrays["params/w"], WHOLE)
    assert whole.arrays["opt/count"] == 7 and whole.arrays["opt/count"].dtype == np.int32
    tree = whole.tree()
    assert tree["step"] == 5 and set(tree) == {"step", "params", "opt"}
    np.testing.assert_array_equal(tree["params"]["w"], WHOLE)  # type: ignore[index]


def test_the_layout_survives_the_manifest_round_trip(tmp_path):
    folder = save(tmp_path / "h0", host_shards(0))
    assert shard_folder.read_manifest(folder).layout == LAYOUT
    assert Manifest.from_json(Manifest(1, ()).to_json(), "old").layout is None  # older manifests read


def test_a_missing_host_is_named_never_zero_filled(tmp_path):
    with pytest.raises(IncompleteCheckpoint, match=r"leaf params/w \(4, 3\): 6 of 12 elements"):
        assemble([save(tmp_path / "h0", host_shards(0))])


def test_twins_that_disagree_are_refused(tmp_path):
    other = WHOLE.copy()
    other[0, 0] = -1
    folders = [save(tmp_path / "h0", host_shards(0)), save(tmp_path / "h1", host_shards(1))]
    with pytest.raises(IncompleteCheckpoint, match="two hosts' copies differ"):
        assemble([*folders, save(tmp_path / "twin", host_shards(0, other))])
    assemble([*folders, save(tmp_path / "good-twin", host_shards(0))])  # the control: twins that agree


def test_shards_without_names_and_corrupt_files_are_refused(tmp_path):
    with pytest.raises(IncompleteCheckpoint, match="no layout"):
        assemble(
            [save(tmp_path / "a", host_shards(0), layout=None), save(tmp_path / "b", host_shards(1), None)]
        )
    folder = save(tmp_path / "c", host_shards(0))
    victim = folder / shard_folder.read_manifest(folder).shards[0].file
    victim.write_bytes(victim.read_bytes()[:-4] + b"\0\0\0\1")
    with pytest.raises(shard_folder.CorruptCheckpoint, match="checksum mismatch"):
        assemble([folder, save(tmp_path / "d", host_shards(1))])


def test_nesting_splits_paths_and_refuses_a_leaf_inside_a_leaf():
    assert nest({"a/b": 1, "a/c/d": 2, "e": 3}) == {"a": {"b": 1, "c": {"d": 2}}, "e": 3}
    with pytest.raises(ValueError, match="passes through the leaf"):
        nest({"a": 1, "a/b": 2})


def run_directory(tmp_path: Path) -> Path:
    """A run directory whose plan names two hosts' disks: host 0 and host 1 hold steps 5 and 10 in
    their local tiers, host 1 also host 0's step 10 as a peer; host 1's step 5 is corrupt."""
    plan: JobPlan = example_plan(tmp_path, local=True)  # run_key "": no persistent tier to look in
    (tmp_path / "run").mkdir(exist_ok=True)
    plan.write(tmp_path / "run" / "plan.json")
    for host in (0, 1):
        local = plan.machine_disk(f"host-{host}") / "local"
        for step in (5, 10):
            save(local, host_shards(host), step=step)
    save(plan.machine_disk("host-1") / "peers" / "host-0", host_shards(0), step=10)
    folder = shard_folder.step_dir(plan.machine_disk("host-1") / "local", 5)
    victim = folder / shard_folder.read_manifest(folder).shards[0].file
    victim.write_bytes(b"\0" * victim.stat().st_size)
    return tmp_path / "run"


def test_a_run_directory_lists_every_copy_and_says_which_steps_are_whole(tmp_path):
    source = CheckpointSource(str(run_directory(tmp_path)), tmp_path / "scratch")
    steps = summarize(source.copies())
    assert [s.step for s in steps] == [5, 10]
    five, ten = steps
    assert not five.complete and "params/w: 6 of 12 elements held" in (five.missing or "")
    assert [c.problem is not None for c in five.copies] == [False, True]
    assert ten.complete and ten.framework == "jax"
    assert sorted((c.tier, c.holder, c.owner) for c in ten.copies) == [
        ("local", "host-0", 0),
        ("local", "host-1", 1),
        ("peer", "host-1", 0),
    ]
    # Without re-hashing, the corrupt copy goes unseen: what --no-verify trades.
    assert summarize(source.copies(verify=False))[0].complete


def test_nothing_held_is_nothing_whole(tmp_path):
    assert summarize([]) == []
    assert coverage([]) == (None, "no intact copy")


def test_an_unknown_source_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such run directory"):
        CheckpointSource(str(tmp_path / "missing"), tmp_path)
