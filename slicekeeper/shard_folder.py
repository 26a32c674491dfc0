"""One host's shard of one checkpoint step, as a folder: the unit every checkpoint tier stores.

The workload writes it into its local tier; supervisors copy it to peers and to the persistent tier
and stage it back. All of them share this one format (stdlib only, so the light workload SDK and the
supervisor agree on it without importing each other):

    step-00000045/            committed: the manifest exists and the folder has its final name
      00000.npy ...           one file per named shard (the workload's choice of encoding)
      manifest.json           {"step": 45, "shards": {name: {"file", "sha256", "size"}},
                               "layout": {...}}, written last
    step-00000050.tmp/        a save under way or cut short: never listed, never restored
    step-00000040.corrupt/    found not to match its manifest: set aside, never listed again

A folder is committed by writing its manifest last and renaming it from `.tmp` to its final name,
so a reader sees a whole step or none. Verification re-hashes every file against the manifest.

A shard's name is `<leaf>/<position>`: the leaf of the training state (`leaf0003`) and the part of
the global array the file holds (`0-64_0-128`, rows 0-63 and columns 0-127; `scalar` for a 0-d leaf).
The optional layout says what each leaf is: its path in the state (`params/layers/0/qkv`), global
shape and dtype, and the framework that wrote it. It is what lets `slicekeeper checkpoint export`
put the hosts' shards back together into whole arrays with their names, with no framework code.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

STEP_PREFIX = "step-"
TMP_SUFFIX = ".tmp"
CORRUPT_SUFFIX = ".corrupt"
MANIFEST = "manifest.json"
HASH_BLOCK = 1 << 20


class CorruptCheckpoint(Exception):
    """A shard folder that is unreadable or does not match its manifest's checksums."""


@dataclass(frozen=True)
class ShardFile:
    name: str
    """The shard's name (e.g. `leaf0003/0-64_0-128`)."""
    file: str
    """File name inside the step folder."""
    sha256: str
    size: int


@dataclass(frozen=True)
class LeafLayout:
    key: str
    """The leaf's part of every shard name (`leaf0003`)."""
    path: str
    """Where the leaf lives in the training state, `/`-separated (`params/layers/0/qkv`)."""
    shape: tuple[int, ...]
    """The global array's shape (a shard holds a part of it)."""
    dtype: str
    """numpy's name for its element type (`float32`)."""


@dataclass(frozen=True)
class Layout:
    """What the leaves of a checkpoint are: the framework that wrote it and each leaf's path."""

    framework: str
    """`jax` or `torch`: which standard format an export writes."""
    leaves: tuple[LeafLayout, ...]

    def to_dict(self) -> dict[str, object]:
        leaves = {
            leaf.key: {"path": leaf.path, "shape": list(leaf.shape), "dtype": leaf.dtype}
            for leaf in self.leaves
        }
        return {"framework": self.framework, "leaves": leaves}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Layout:
        """Raises ValueError, KeyError, TypeError or AttributeError on malformed data."""
        leaves = data["leaves"]
        if not isinstance(leaves, dict):
            raise TypeError("layout leaves must be an object")
        return cls(
            str(data["framework"]),
            tuple(
                LeafLayout(
                    str(key), str(entry["path"]), tuple(int(n) for n in entry["shape"]), str(entry["dtype"])
                )
                for key, entry in leaves.items()
            ),
        )


@dataclass(frozen=True)
class Manifest:
    step: int
    shards: tuple[ShardFile, ...]
    layout: Layout | None = None
    """What the leaves are, when the writer said (the SDK's checkpointers do)."""

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards)

    def to_json(self) -> str:
        shards = {s.name: {"file": s.file, "sha256": s.sha256, "size": s.size} for s in self.shards}
        data: dict[str, object] = {"step": self.step, "shards": shards}
        if self.layout is not None:
            data["layout"] = self.layout.to_dict()
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        try:
            data = json.loads(text)
            shards = tuple(
                ShardFile(str(name), str(entry["file"]), str(entry["sha256"]), int(entry["size"]))
                for name, entry in data["shards"].items()
            )
            layout = Layout.from_dict(data["layout"]) if data.get("layout") is not None else None
            manifest = cls(int(data["step"]), shards, layout)
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError) as error:
            # OverflowError: a size of Infinity; RecursionError: JSON nested too deeply.
            raise CorruptCheckpoint(f"{where}: unreadable manifest ({error!r})") from None
        for shard in shards:
            if "/" in shard.file or shard.file in ("", ".", "..", MANIFEST):
                raise CorruptCheckpoint(f"{where}: manifest names an invalid file {shard.file!r}")
        return manifest


def step_dir(directory: Path, step: int) -> Path:
    return directory / f"{STEP_PREFIX}{step:08d}"


def tmp_dir(directory: Path, step: int) -> Path:
    final = step_dir(directory, step)
    return final.with_name(final.name + TMP_SUFFIX)


def committed_steps(directory: Path) -> list[int]:
    """Steps committed in `directory` (a folder with its final name and a manifest), oldest first."""
    steps = []
    for entry in directory.glob(f"{STEP_PREFIX}*"):
        if entry.suffix in (TMP_SUFFIX, CORRUPT_SUFFIX) or not (entry / MANIFEST).is_file():
            continue
        with contextlib.suppress(ValueError):
            steps.append(int(entry.name.removeprefix(STEP_PREFIX)))
    return sorted(steps)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(HASH_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(folder: Path) -> Manifest:
    try:
        text = (folder / MANIFEST).read_text()
    except OSError as error:
        raise CorruptCheckpoint(f"{folder}: no readable manifest ({error.strerror or error})") from None
    return Manifest.from_json(text, str(folder))


def verify(folder: Path) -> Manifest:
    """Re-hash every file of `folder` against its manifest; raise CorruptCheckpoint on a mismatch."""
    manifest = read_manifest(folder)
    for shard in manifest.shards:
        path = folder / shard.file
        try:
            ok = path.stat().st_size == shard.size and sha256_file(path) == shard.sha256
        except OSError:
            ok = False
        if not ok:
            raise CorruptCheckpoint(f"{path}: checksum mismatch for shard {shard.name}")
    return manifest


def write_manifest(folder: Path, manifest: Manifest) -> None:
    path = folder / MANIFEST
    with path.open("w") as out:
        out.write(manifest.to_json())
        out.flush()
        os.fsync(out.fileno())


def commit(tmp: Path, final: Path) -> None:
    """Make a fully written `tmp` folder (manifest last) visible under its final name, atomically."""
    if final.exists():
        shutil.rmtree(final)  # a stale copy of the same step is replaced whole
    os.rename(tmp, final)
    fsync_path(final.parent)


def quarantine(folder: Path) -> None:
    """Set a corrupt folder aside (kept for a post-mortem, never listed again)."""
    if folder.exists():
        target = folder.with_name(folder.name + CORRUPT_SUFFIX)
        shutil.rmtree(target, ignore_errors=True)
        os.rename(folder, target)


def retain(directory: Path, keep: int) -> None:
    """Keep the newest `keep` committed steps of `directory`, delete the older ones."""
    for step in committed_steps(directory)[:-keep] if keep > 0 else committed_steps(directory):
        shutil.rmtree(step_dir(directory, step), ignore_errors=True)
