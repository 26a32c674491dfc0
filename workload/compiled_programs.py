"""Each host's compiled programs kept on disk, so a restarted process loads instead of compiling.

JAX's persistent compilation cache serves only process 0 of a multi-process job: its key holds the
process's own devices, and only process 0 writes (jax._src.compiler._cache_write). Every other host
of a restarted job compiled its programs again, seconds per restart on each host (issue 18).

Here every process serializes its own compiled executables (jax.experimental.serialize_executable)
into the compilation cache directory, under a key of everything the executable depends on: the
lowered program's text (shapes, shardings, collectives), this process's place in the world (index,
count, its devices' ids), and the jax, jaxlib and backend versions. A restarted process with the
same key, or a spare that takes the same rank in the same world, deserializes it in milliseconds.
Anything that cannot be loaded (another version, a damaged or cut-short file) is compiled again and
rewritten; files are written beside their name and renamed into place, so a reader never sees half
of one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any

import jax
from jax.experimental import serialize_executable

FORMAT = 1
"""Bump when what is stored changes."""


class ProgramCache:
    """One process's compiled programs in `directory` (shared by every process of the job is fine:
    each process's files have keys of their own)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory) / "executables"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.loaded: list[str] = []
        """Names of the programs this process loaded instead of compiling."""
        self.compiled: list[str] = []

    def key(self, name: str, lowered: Any) -> str:
        """What the executable of `lowered` on this process depends on, hashed."""
        backend = jax.devices()[0].client
        digest = hashlib.sha256()
        for part in (
            f"format {FORMAT}",
            name,
            jax.__version__,
            getattr(jax.lib, "__version__", ""),
            backend.platform,
            backend.platform_version,
            f"process {jax.process_index()} of {jax.process_count()}",
            ",".join(str(device.id) for device in jax.local_devices()),
            os.environ.get("XLA_FLAGS", ""),
            lowered.as_text(),
        ):
            digest.update(part.encode())
            digest.update(b"\0")
        return digest.hexdigest()

    def load_or_compile(self, name: str, lowered: Any) -> Any:
        """The compiled program of `lowered` (a `jax.stages.Lowered`): loaded when this process
        compiled it before with the same key, else compiled and stored."""
        path = self.directory / f"{name}-{self.key(name, lowered)}.bin"
        with contextlib.suppress(FileNotFoundError):
            try:
                payload, in_tree, out_tree = pickle.loads(path.read_bytes())
                compiled = serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
            except FileNotFoundError:
                raise
            except Exception as error:  # another jaxlib, a damaged file: compile again
                print(
                    f"slicekeeper: compiled program {path.name} not loadable ({error!r}); compiling",
                    file=sys.stderr,
                )
            else:
                self.loaded.append(name)
                return compiled
        compiled = lowered.compile()
        self.compiled.append(name)
        self._store(path, compiled)
        return compiled

    def _store(self, path: Path, compiled: Any) -> None:
        try:
            payload = pickle.dumps(serialize_executable.serialize(compiled))
            with tempfile.NamedTemporaryFile(
                dir=self.directory, prefix=f".{path.name}.", delete=False
            ) as out:
                out.write(payload)
            os.replace(out.name, path)
        except Exception as error:  # a full disk or an unserializable program costs a compile, no more
            print(f"slicekeeper: could not store compiled program {path.name}: {error!r}", file=sys.stderr)
