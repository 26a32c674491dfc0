"""The local tier: atomic saves, verified restores, retention and discarding of unagreed steps."""

import json
import shutil
import threading
import time

import numpy as np
import pytest
from slicekeeper.workload.local_tier import CorruptCheckpoint, LocalTier

from slicekeeper import shard_folder
from slicekeeper.shard_folder import MANIFEST

WAIT = 5.0
"""Seconds a test waits for a background save before calling it stuck."""


@pytest.fixture
def tier(tmp_path):
    tier = LocalTier(tmp_path / "local", keep=3)
    yield tier
    tier.close()


def shards_for(step: int) -> dict[str, np.ndarray]:
    return {
        "leaf0000/0-4_0-8": np.arange(32, dtype=np.float32).reshape(4, 8) * step,
        "leaf0001/0-3": np.array([step, -1, 2**40], dtype=np.int64),
        "leaf0002/scalar": np.array(0.1 * step, dtype=np.float64),
        "leaf0003/0-2": np.array([True, False]),
    }


def save(tier: LocalTier, step: int) -> None:
    tier.save_async(step, shards_for(step)).result(timeout=WAIT)


def step_dir(tier: LocalTier, step: int):
    return tier.directory / f"step-{step:08d}"


def test_save_then_restore_round_trips_names_values_shapes_and_dtypes(tier):
    original = shards_for(7)
    tier.save_async(7, original).result(timeout=WAIT)
    restored = tier.restore(7)
    assert set(restored) == set(original)
    for name, array in original.items():
        assert restored[name].dtype == array.dtype
        assert restored[name].shape == array.shape
        np.testing.assert_array_equal(restored[name], array)


def test_special_float_values_and_empty_arrays_survive_a_round_trip(tier):
    original = {
        "special": np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45], dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.int8),
    }
    tier.save_async(1, original).result(timeout=WAIT)
    restored = tier.restore(1)
    assert restored["special"].tobytes() == original["special"].tobytes()
    assert restored["empty"].shape == (0, 3)
    assert restored["empty"].dtype == np.int8


def test_a_step_is_listed_only_once_its_save_has_completed(tier, monkeypatch):
    release = threading.Event()
    writing = threading.Event()
    real_sha256 = shard_folder.sha256_file

    def slow_sha256(path):
        writing.set()
        assert release.wait(WAIT), "the test never released the save"
        return real_sha256(path)

    monkeypatch.setattr(shard_folder, "sha256_file", slow_sha256)
    future = tier.save_async(10, shards_for(10))
    assert writing.wait(WAIT)
    assert not future.done()
    assert tier.committed_steps() == []
    release.set()
    future.result(timeout=WAIT)
    assert tier.committed_steps() == [10]


def test_the_folder_of_a_save_cut_short_is_never_listed(tier):
    save(tier, 10)
    cut_short = tier.directory / "step-00000020.tmp"
    cut_short.mkdir()
    (cut_short / "00000.npy").write_bytes(b"half a shard")
    assert tier.committed_steps() == [10]


def test_a_cut_short_folder_is_not_listed_even_with_its_manifest_written(tier):
    save(tier, 10)
    shutil.copytree(step_dir(tier, 10), tier.directory / "step-00000020.tmp")
    assert tier.committed_steps() == [10]


def test_a_step_folder_without_a_manifest_is_not_committed(tier):
    (tier.directory / "step-00000030").mkdir()
    assert tier.committed_steps() == []


def test_steps_are_listed_oldest_first(tier):
    for step in (30, 5, 100):
        save(tier, step)
    assert tier.committed_steps() == [5, 30, 100]


def test_flipped_bytes_in_a_shard_make_restore_refuse_the_step(tier):
    save(tier, 10)
    shard = sorted(step_dir(tier, 10).glob("*.npy"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # a bit flip in the array data, the header still parses
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch"):
        tier.restore(10)


def test_a_truncated_shard_makes_restore_refuse_the_step(tier):
    save(tier, 10)
    shard = sorted(step_dir(tier, 10).glob("*.npy"))[1]
    shard.write_bytes(shard.read_bytes()[:-4])
    with pytest.raises(CorruptCheckpoint):
        tier.restore(10)


def test_a_missing_shard_makes_restore_refuse_the_step(tier):
    save(tier, 10)
    sorted(step_dir(tier, 10).glob("*.npy"))[0].unlink()
    with pytest.raises(CorruptCheckpoint):
        tier.restore(10)


def test_a_missing_manifest_makes_restore_refuse_the_step(tier):
    save(tier, 10)
    (step_dir(tier, 10) / MANIFEST).unlink()
    with pytest.raises(CorruptCheckpoint, match="no readable manifest"):
        tier.restore(10)


def test_a_garbled_manifest_makes_restore_refuse_the_step(tier):
    save(tier, 10)
    manifest = step_dir(tier, 10) / MANIFEST
    manifest.write_bytes(manifest.read_bytes()[:20])
    with pytest.raises(CorruptCheckpoint, match="unreadable manifest"):
        tier.restore(10)


@pytest.mark.parametrize("text", ['{"step": 10}', "[]", '{"step": 10, "shardz": {}}'])
def test_a_manifest_that_parses_but_has_no_shard_table_makes_restore_refuse_the_step(tier, text):
    save(tier, 10)
    (step_dir(tier, 10) / MANIFEST).write_text(text)
    with pytest.raises(CorruptCheckpoint):
        tier.restore(10)


def test_a_step_that_was_never_committed_cannot_be_restored(tier):
    save(tier, 10)
    shutil.copytree(step_dir(tier, 10), tier.directory / "step-00000020.tmp")
    with pytest.raises(CorruptCheckpoint):
        tier.restore(20)


def test_retention_keeps_the_newest_steps(tmp_path):
    tier = LocalTier(tmp_path, keep=2)
    try:
        for step in (10, 20, 30, 40):
            save(tier, step)
        assert tier.committed_steps() == [30, 40]
        assert not step_dir(tier, 10).exists()
        assert not step_dir(tier, 20).exists()
        np.testing.assert_array_equal(tier.restore(30)["leaf0001/0-3"], shards_for(30)["leaf0001/0-3"])
    finally:
        tier.close()


def test_retention_counts_steps_not_save_order(tmp_path):
    tier = LocalTier(tmp_path, keep=2)
    try:
        for step in (30, 40, 10):
            save(tier, step)
        assert tier.committed_steps() == [30, 40]
    finally:
        tier.close()


def test_saving_a_step_again_replaces_the_stale_copy_whole(tier):
    save(tier, 10)
    replacement = {"only": np.array([1, 2, 3], dtype=np.int16)}
    tier.save_async(10, replacement).result(timeout=WAIT)
    restored = tier.restore(10)
    assert list(restored) == ["only"]
    np.testing.assert_array_equal(restored["only"], replacement["only"])
    assert tier.committed_steps() == [10]


def test_discard_after_a_step_drops_newer_steps_and_leftovers(tier):
    for step in (10, 20, 30):
        save(tier, step)
    (tier.directory / "step-00000040.tmp").mkdir()
    tier.discard_after(20)
    assert tier.committed_steps() == [10, 20]
    assert sorted(p.name for p in tier.directory.iterdir()) == ["step-00000010", "step-00000020"]
    np.testing.assert_array_equal(tier.restore(20)["leaf0000/0-4_0-8"], shards_for(20)["leaf0000/0-4_0-8"])


def test_discard_after_none_drops_every_step(tier):
    for step in (10, 20):
        save(tier, step)
    (tier.directory / "step-00000030.tmp").mkdir()
    tier.discard_after(None)
    assert tier.committed_steps() == []
    assert list(tier.directory.iterdir()) == []


def test_discard_after_a_step_older_than_all_drops_everything(tier):
    for step in (10, 20):
        save(tier, step)
    tier.discard_after(5)
    assert tier.committed_steps() == []


def test_a_shard_that_cannot_be_saved_fails_the_future_and_commits_nothing(tier):
    save(tier, 10)
    bad = {**shards_for(20), "objects": np.array([{"a": 1}, None], dtype=object)}
    future = tier.save_async(20, bad)
    with pytest.raises(ValueError):
        future.result(timeout=WAIT)
    assert tier.committed_steps() == [10]
    assert not step_dir(tier, 20).exists()


def test_a_folder_that_cannot_be_created_fails_the_future_and_commits_nothing(tier):
    save(tier, 10)
    # A file where the save's folder must go: fails for root too, unlike a read-only directory.
    (tier.directory / "step-00000020.tmp").write_text("in the way")
    future = tier.save_async(20, shards_for(20))
    with pytest.raises(OSError):
        future.result(timeout=WAIT)
    assert tier.committed_steps() == [10]
    assert not step_dir(tier, 20).exists()


def test_a_tier_whose_directory_is_gone_fails_the_future(tmp_path):
    directory = tmp_path / "local"
    tier = LocalTier(directory, keep=3)
    try:
        shutil.rmtree(directory)
        directory.write_text("not a directory any more")
        future = tier.save_async(10, shards_for(10))
        with pytest.raises(OSError):
            future.result(timeout=WAIT)
    finally:
        tier.close()


def test_a_failed_save_does_not_stop_the_next_one(tier):
    bad = {"objects": np.array([object()], dtype=object)}
    with pytest.raises(ValueError):
        tier.save_async(10, bad).result(timeout=WAIT)
    save(tier, 20)
    assert tier.committed_steps() == [20]
    tier.discard_after(None)
    assert list(tier.directory.iterdir()) == []


def test_the_manifest_records_the_step_and_a_checksum_for_every_shard(tier):
    save(tier, 10)
    manifest = json.loads((step_dir(tier, 10) / MANIFEST).read_text())
    assert manifest["step"] == 10
    assert set(manifest["shards"]) == set(shards_for(10))
    assert all(len(entry["sha256"]) == 64 for entry in manifest["shards"].values())


def test_a_step_found_corrupt_at_restore_is_set_aside_and_reported(tmp_path):
    from slicekeeper.workload.checkpointing import Checkpointer
    from slicekeeper.workload.local_tier import CorruptCheckpoint
    from slicekeeper.workload.sdk import HostIdentity, Session

    sent: list[dict] = []

    class Recording(Session):
        def _send(self, event, **fields):
            sent.append({"type": event.value, **fields})

    identity = HostIdentity.from_env(
        {"SLICEKEEPER_CHECKPOINT_DIR": str(tmp_path), "SLICEKEEPER_CHECKPOINT_KEEP": "5"}
    )
    checkpointer = Checkpointer(Recording(identity, None))
    checkpointer.tier.save_async(10, {"x": np.arange(4.0)}).result()
    shard = next((tmp_path / "step-00000010").glob("*.npy"))
    shard.write_bytes(shard.read_bytes()[:-3] + b"bad")
    with pytest.raises(CorruptCheckpoint):
        checkpointer.restore(10)
    assert shard_folder.committed_steps(tmp_path) == []  # never listed again
    assert (tmp_path / "step-00000010.corrupt").is_dir()  # kept for a post-mortem
    assert [m["type"] for m in sent if m["type"] == "checkpoint_failed"] == ["checkpoint_failed"]


@pytest.mark.parametrize("verified", [False, True])
def test_a_restore_the_supervisor_already_verified_is_not_hashed_again(tmp_path, monkeypatch, verified):
    from slicekeeper.workload.checkpointing import Checkpointer
    from slicekeeper.workload.sdk import HostIdentity, Session

    env = {
        "SLICEKEEPER_CHECKPOINT_DIR": str(tmp_path),
        "SLICEKEEPER_RESTORE_VERIFIED": "1" if verified else "",
    }
    checkpointer = Checkpointer(Session(HostIdentity.from_env(env), None))
    checkpointer.tier.save_async(10, {"x": np.arange(4.0)}).result()
    hashed: list[object] = []
    real_sha256 = shard_folder.sha256_file
    monkeypatch.setattr(shard_folder, "sha256_file", lambda path: hashed.append(path) or real_sha256(path))
    restored = checkpointer.restore(10)
    assert restored is not None and restored["x"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert len(hashed) == (0 if verified else 1)
    checkpointer.close()


def test_a_flush_reports_the_save_under_way_and_later_saves_go_on(tmp_path, monkeypatch):
    from slicekeeper.workload.checkpointing import Checkpointer
    from slicekeeper.workload.sdk import HostIdentity, Session

    sent: list[dict] = []

    class Recording(Session):
        def _send(self, event, **fields):
            sent.append({"type": event.value, **fields})

    real_sha256 = shard_folder.sha256_file

    def slow_sha256(path):
        time.sleep(0.2)  # the save is still under way when the loop asks
        return real_sha256(path)

    monkeypatch.setattr(shard_folder, "sha256_file", slow_sha256)
    env = {"SLICEKEEPER_CHECKPOINT_DIR": str(tmp_path), "SLICEKEEPER_CHECKPOINT_INTERVAL": "5"}
    checkpointer = Checkpointer(Recording(HostIdentity.from_env(env), None))
    checkpointer.maybe_save(5, lambda: {"x": np.arange(4.0)})
    checkpointer.flush()
    assert [m["step"] for m in sent if m["type"] == "checkpoint_saved"] == [5]
    checkpointer.maybe_save(10, lambda: {"x": np.arange(4.0)})
    checkpointer.close()
    assert [m["step"] for m in sent if m["type"] == "checkpoint_saved"] == [5, 10]
