"""The persistent tier: marker-based commits, verified transfers, retention and clear reachability errors."""

import errno
import importlib.util
import uuid

import pytest
from fsspec.core import url_to_fs
from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTier, PersistentTierError

from slicekeeper import shard_folder
from slicekeeper.shard_folder import MANIFEST, CorruptCheckpoint, Manifest, ShardFile

BIG = (1 << 20) + 12345
"""Size of one shard file: more than one copy chunk."""


@pytest.fixture(params=["directory", "memory"])
def tier(request, tmp_path):
    if request.param == "directory":
        yield PersistentTier(str(tmp_path / "store"), "job/run-1")
        return
    tier = PersistentTier("memory://slicekeeper-tests", f"job/{uuid.uuid4().hex}")
    yield tier
    fs, base = url_to_fs(tier.location)
    if fs.exists(base):
        fs.rm(base, recursive=True)


def contents(step: int, host: int) -> dict[str, bytes]:
    seed = bytes([step % 256, host % 256])
    return {
        "leaf0000/0-4_0-8": (seed + bytes(range(256))) * (BIG // 258) + seed,
        "leaf0001/scalar": seed * 5,
        "leaf0002/empty": b"",
    }


def make_shard(directory, step: int, host: int):
    """A committed local shard folder, in the shard_folder format."""
    tmp = shard_folder.tmp_dir(directory, step)
    tmp.mkdir(parents=True)
    shards = []
    for index, (name, data) in enumerate(contents(step, host).items()):
        path = tmp / f"{index:05d}.bin"
        path.write_bytes(data)
        shards.append(ShardFile(name, path.name, shard_folder.sha256_file(path), len(data)))
    shard_folder.write_manifest(tmp, Manifest(step, tuple(shards)))
    final = shard_folder.step_dir(directory, step)
    shard_folder.commit(tmp, final)
    return final


def upload_step(tier, tmp_path, step: int, hosts=(0, 1), commit=True):
    for host in hosts:
        tier.upload(host, make_shard(tmp_path / f"local-{host}", step, host))
    if commit:
        tier.commit(step)


def store_path(tier, *parts: str):
    fs, base = url_to_fs(tier.location)
    return fs, "/".join([base, *parts])


def leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


# -- round trip ---------------------------------------------------------------------------------


def test_every_read_from_the_store_is_counted_by_the_tier_and_uploads_read_nothing(tier, tmp_path):
    upload_step(tier, tmp_path, 45)
    assert tier.reads.shards == tier.reads.objects == tier.reads.bytes == 0  # writing reads nothing
    tier.download(1, 45, tmp_path / "restored")
    shard_bytes = sum(len(data) for data in contents(45, 1).values())
    manifest_bytes = (shard_folder.step_dir(tmp_path / "local-1", 45) / MANIFEST).stat().st_size
    assert tier.reads.shards == 1
    assert tier.reads.objects == 1 + len(contents(45, 1))  # the manifest, then each shard file
    assert tier.reads.bytes == manifest_bytes + shard_bytes


def test_a_download_that_fails_half_way_still_counts_what_it_read(tier, tmp_path):
    upload_step(tier, tmp_path, 45)
    fs, path = store_path(tier, "step-00000045", "host-0", "00001.bin")
    fs.pipe_file(path, b"not the scalar")
    with pytest.raises(CorruptCheckpoint):
        tier.download(0, 45, tmp_path / "restored")
    assert tier.reads.shards == 1 and tier.reads.objects >= 2 and tier.reads.bytes > 0


def test_committed_owners_reads_each_commit_marker_and_names_the_hosts_it_holds(tier, tmp_path):
    upload_step(tier, tmp_path, 40, hosts=(0, 1))
    upload_step(tier, tmp_path, 50, hosts=(0,))
    upload_step(tier, tmp_path, 60, hosts=(0, 1), commit=False)
    assert tier.committed_owners() == {40: {0, 1}, 50: {0}}
    assert tier.reads.objects == 2 and tier.reads.shards == 0
    fs, marker = store_path(tier, "step-00000050", "COMMITTED")
    fs.pipe_file(marker, b"{not json")
    assert tier.committed_owners() == {40: {0, 1}}  # an unreadable marker commits nothing


def test_a_store_with_no_folder_for_the_job_has_no_committed_steps(tmp_path):
    assert PersistentTier(str(tmp_path / "nothing-here"), "job/run").committed_owners() == {}


def test_an_uploaded_and_committed_step_downloads_bit_identical_to_the_original(tier, tmp_path):
    original = make_shard(tmp_path / "local-0", 45, 0)
    sent = tier.upload(0, original)
    tier.commit(45)
    received = tier.download(0, 45, tmp_path / "restored")
    restored = shard_folder.step_dir(tmp_path / "restored", 45)
    manifest = shard_folder.verify(restored)
    assert manifest == shard_folder.read_manifest(original)
    assert sent == received == manifest.total_bytes
    for shard in manifest.shards:
        assert (restored / shard.file).read_bytes() == (original / shard.file).read_bytes()
    assert leftovers(tmp_path / "restored") == ["step-00000045"]


def test_each_host_downloads_its_own_shard_of_a_committed_step(tier, tmp_path):
    upload_step(tier, tmp_path, 7, hosts=(0, 1, 2))
    tier.download(2, 7, tmp_path / "restored")
    restored = shard_folder.step_dir(tmp_path / "restored", 7)
    names = {s.name: s.file for s in shard_folder.verify(restored).shards}
    assert {n: (restored / f).read_bytes() for n, f in names.items()} == contents(7, 2)


def test_reuploading_the_same_shard_of_a_committed_step_is_a_no_op(tier, tmp_path):
    upload_step(tier, tmp_path, 3)
    assert tier.upload(0, shard_folder.step_dir(tmp_path / "local-0", 3)) == 0
    assert tier.committed_steps() == [3]


# -- the commit rule ----------------------------------------------------------------------------


def test_an_uncommitted_step_is_not_listed_and_cannot_be_downloaded(tier, tmp_path):
    upload_step(tier, tmp_path, 5)
    upload_step(tier, tmp_path, 6, commit=False)
    assert tier.committed_steps() == [5]
    with pytest.raises(PersistentTierError, match="step 6 is not committed"):
        tier.download(0, 6, tmp_path / "restored")
    assert leftovers(tmp_path / "restored") == []


def test_committed_steps_are_listed_oldest_first(tier, tmp_path):
    for step in (20, 3, 100):
        upload_step(tier, tmp_path, step, hosts=(0,))
    assert tier.committed_steps() == [3, 20, 100]


def test_hosts_uploaded_lists_the_hosts_whose_manifest_exists(tier, tmp_path):
    assert tier.hosts_uploaded(9) == set()
    upload_step(tier, tmp_path, 9, hosts=(0, 3), commit=False)
    assert tier.hosts_uploaded(9) == {0, 3}
    assert tier.hosts_uploaded(10) == set()


def test_a_host_folder_without_a_manifest_is_not_counted_as_uploaded(tier, tmp_path):
    upload_step(tier, tmp_path, 9, hosts=(0,), commit=False)
    fs, folder = store_path(tier, "step-00000009", "host-1")
    fs.makedirs(folder, exist_ok=True)
    with fs.open(f"{folder}/00000.bin", "wb") as file:
        file.write(b"half an upload")
    assert tier.hosts_uploaded(9) == {0}


def test_a_step_no_host_uploaded_cannot_be_committed(tier):
    with pytest.raises(PersistentTierError, match="no host uploaded"):
        tier.commit(4)
    assert tier.committed_steps() == []


# -- integrity ----------------------------------------------------------------------------------


def test_uploading_an_altered_source_raises_corrupt_checkpoint_and_leaves_the_host_incomplete(tier, tmp_path):
    upload_step(tier, tmp_path, 8, hosts=(0,), commit=False)
    folder = make_shard(tmp_path / "local-1", 8, 1)
    altered = folder / "00000.bin"
    data = bytearray(altered.read_bytes())
    data[BIG // 2] ^= 0xFF
    altered.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch"):
        tier.upload(1, folder)
    assert tier.hosts_uploaded(8) == {0}
    fs, manifest = store_path(tier, "step-00000008", "host-1", MANIFEST)
    assert not fs.exists(manifest)


def test_a_shard_corrupted_in_the_store_fails_download_and_leaves_nothing_in_the_destination(tier, tmp_path):
    upload_step(tier, tmp_path, 12)
    fs, remote = store_path(tier, "step-00000012", "host-0", "00001.bin")
    with fs.open(remote, "wb") as file:
        file.write(b"\x00" * len(contents(12, 0)["leaf0001/scalar"]))
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch"):
        tier.download(0, 12, tmp_path / "restored")
    assert leftovers(tmp_path / "restored") == []
    assert shard_folder.committed_steps(tmp_path / "restored") == []


def test_a_file_missing_from_the_store_fails_download_as_corrupt(tier, tmp_path):
    upload_step(tier, tmp_path, 12)
    fs, remote = store_path(tier, "step-00000012", "host-1", "00000.bin")
    fs.rm(remote)
    with pytest.raises(CorruptCheckpoint, match="missing"):
        tier.download(1, 12, tmp_path / "restored")
    assert leftovers(tmp_path / "restored") == []


# -- retention ----------------------------------------------------------------------------------


def test_retention_keeps_the_newest_committed_steps_and_drops_older_partial_ones(tier, tmp_path):
    for step in (1, 3, 4, 5):
        upload_step(tier, tmp_path, step)
    upload_step(tier, tmp_path, 2, hosts=(0,), commit=False)  # never completes
    upload_step(tier, tmp_path, 6, hosts=(0,), commit=False)  # still under way
    tier.retain(2)
    assert tier.committed_steps() == [4, 5]
    for gone in (1, 2, 3):
        fs, folder = store_path(tier, f"step-{gone:08d}")
        assert not fs.exists(folder)
    assert tier.hosts_uploaded(6) == {0}
    tier.download(1, 4, tmp_path / "restored")


def test_retention_without_committed_steps_deletes_nothing(tier, tmp_path):
    upload_step(tier, tmp_path, 2, hosts=(0,), commit=False)
    tier.retain(1)
    assert tier.hosts_uploaded(2) == {0}


# -- reachability -------------------------------------------------------------------------------


def test_probe_passes_on_a_writable_location_and_leaves_nothing_behind(tier):
    tier.probe()
    fs, base = store_path(tier)
    assert fs.ls(base, detail=False) == []


def test_probe_fails_clearly_under_a_regular_file(tmp_path):
    (tmp_path / "afile").write_text("not a directory")
    tier = PersistentTier(str(tmp_path / "afile" / "sub"), "job/run")
    with pytest.raises(PersistentTierError, match="not a directory") as failure:
        tier.probe()
    assert str(tmp_path / "afile" / "sub" / "job" / "run") in str(failure.value)


def test_probe_fails_clearly_on_an_unknown_protocol():
    tier = PersistentTier("nosuchproto://bucket/ckpt", "job/run")
    assert tier.location == "nosuchproto://bucket/ckpt/job/run"
    with pytest.raises(PersistentTierError, match=r"unknown protocol.*nosuchproto"):
        tier.probe()
    with pytest.raises(PersistentTierError, match="nosuchproto://bucket/ckpt/job/run"):
        tier.committed_steps()


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None, reason="gcsfs is installed")
def test_probe_names_the_package_to_install_for_gs():
    with pytest.raises(PersistentTierError, match="gcsfs"):
        PersistentTier("gs://bucket/ckpt", "job/run").probe()


# -- I/O errors ---------------------------------------------------------------------------------


def test_a_full_disk_during_upload_raises_persistent_tier_error_and_nothing_is_uploaded(
    tier, tmp_path, monkeypatch
):
    fs, _ = store_path(tier)
    real_open = fs.open
    writes = []

    def open_until_full(path, mode="rb", *args, **kwargs):
        if "w" in mode:
            writes.append(path)
            if len(writes) > 1:
                raise OSError(errno.ENOSPC, "No space left on device", path)
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(fs, "open", open_until_full)
    with pytest.raises(PersistentTierError, match="no space left") as failure:
        tier.upload(0, make_shard(tmp_path / "local-0", 30, 0))
    assert tier.location in str(failure.value)
    monkeypatch.undo()
    assert tier.hosts_uploaded(30) == set()
    assert not fs.exists(store_path(tier, "step-00000030", "host-0")[1])


def test_an_invalid_run_key_is_refused():
    with pytest.raises(ValueError, match="run key"):
        PersistentTier("memory://x", "job/../escape")
