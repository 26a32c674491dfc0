"""Committed shard folders as a workload writes them, for the peer tier's tests."""

from __future__ import annotations

import os
from pathlib import Path

from slicekeeper import shard_folder
from slicekeeper.shard_folder import Manifest, ShardFile


def make_folder(directory: Path, step: int, files: dict[str, bytes]) -> Path:
    """A committed shard folder with one file per entry of `files`, written as the workload would."""
    tmp = shard_folder.tmp_dir(directory, step)
    tmp.mkdir(parents=True)
    shards = []
    for index, (name, data) in enumerate(files.items()):
        file = f"{index:05d}.bin"
        (tmp / file).write_bytes(data)
        shards.append(ShardFile(name, file, shard_folder.sha256_file(tmp / file), len(data)))
    shard_folder.write_manifest(tmp, Manifest(step, tuple(shards)))
    final = shard_folder.step_dir(directory, step)
    shard_folder.commit(tmp, final)
    return final


def contents(step: int) -> dict[str, bytes]:
    return {
        "leaf0000/0-4_0-8": bytes([step % 256]) * 4096,
        "leaf0001/big": os.urandom((5 << 20) // 2),  # spans several 1 MiB chunks
        "leaf0002/empty": b"",
    }


def files_of(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}
