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

Tracing and lowering a program only to compute its key cost the reference trainer 0.6-0.7 s of its
1.1-1.3 s `program_startup` at each restart (cProfile: `jit_trace`). A caller that can name what its
program depends on passes a `signature` instead (its code's digest, its configuration, shapes and
shardings): the key is then that signature, this process's place in the world, the versions, XLA_FLAGS
and every jax configuration value, and a hit loads without tracing. A signature that misses
something the program depends on would load a stale program: keep it whole, or pass none.

JAX's own persistent compilation cache must be off in a process that stores here: an executable it
served (process 0's, whose cache entries it writes) serializes without all of its kernels, and loading
that copy fails at the first run ("Function wrapped_copy not found"; seen at every restart of host 0
once its JAX cache held the programs). While it is on, nothing is stored here; loading still works.

The files are pickles, and unpickling runs code: the directory is made private (0700) and one owned
by another user, or writable by others, is not read (nor written) at all; each program is compiled.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
from jax.experimental import serialize_executable

FORMAT = 2
"""Bump when what is stored or how it is keyed changes."""

Lowering = Any | Callable[[], Any]
"""A `jax.stages.Lowered`, or what makes one when needed."""


BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
"""JAX's event for each program it compiles for the backend (jax._src.dispatch), with its name."""

_backend_compiled: list[str] | None = None


def backend_compiled() -> list[str]:
    """The names of the programs XLA compiled in this process since the first call, from JAX's own
    compile events: a record independent of ProgramCache's lists (a program loaded from the cache
    raises no such event; one compiled behind the cache's back does)."""
    global _backend_compiled
    if _backend_compiled is None:
        names: list[str] = []

        def heard(event: str, duration_secs: float, **fields: str | int) -> None:
            if event == BACKEND_COMPILE_EVENT:
                names.append(str(fields.get("fun_name", "?")))

        jax.monitoring.register_event_duration_secs_listener(heard)
        _backend_compiled = names
    return _backend_compiled


class ProgramCache:
    """One process's compiled programs in `directory` (shared by every process of the job is fine:
    each process's files have keys of their own). Without a directory every program is compiled;
    `loaded` and `compiled` still say which programs this start prepared and how."""

    def __init__(self, directory: str | Path | None) -> None:
        self.directory = Path(directory) / "executables" if directory else None
        self.refusal: str | None = "no compilation cache directory is set"
        """Why the directory is not used (None: it is)."""
        if self.directory is not None:
            try:
                self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                self.refusal = untrusted(self.directory)
            except OSError as error:  # e.g. a shared volume this user may not write to
                self.refusal = f"it cannot be made: {error.strerror or error}"
            if self.refusal:
                _say(f"not using compiled programs in {self.directory}: {self.refusal}")
        self.storing = self.refusal is None and not jax.config.values.get("jax_compilation_cache_dir")
        """Whether compiled programs are stored (not while JAX's own persistent cache is on)."""
        if self.refusal is None and not self.storing:
            _say(
                "JAX's persistent compilation cache is on: compiled programs are not stored "
                "(workload/compiled_programs.py says why)"
            )
        self.backend_compiled = backend_compiled()
        """What XLA compiled in this process from now on, by JAX's own account (`backend_compiled`)."""
        self.loaded: list[str] = []
        """Names of the programs this process loaded instead of compiling."""
        self.compiled: list[str] = []

    def key(self, name: str, program: str) -> str:
        """What the executable of `program` (a lowered program's text, or a caller's signature) on
        this process depends on, hashed."""
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
            repr(sorted(jax.config.values.items())),
            program,
        ):
            digest.update(part.encode())
            digest.update(b"\0")
        return digest.hexdigest()

    def load_or_compile(self, name: str, lowering: Lowering, *, signature: str | None = None) -> Any:
        """The compiled program: loaded when this process compiled it before under the same key,
        else compiled and stored. `lowering`: the `jax.stages.Lowered`, or a callable making it, only
        called when the program must be compiled and a `signature` keys it (see the module's doc)."""
        lowered: Any = None
        if signature is None:
            lowered = _lowered(lowering)
            signature = lowered.as_text()
        path = None
        if self.directory is not None and self.refusal is None:
            path = self.directory / f"{name}-{self.key(name, signature)}.bin"
            compiled = self._load(path)
            if compiled is not None:
                self.loaded.append(name)
                return compiled
        compiled = (lowered if lowered is not None else _lowered(lowering)).compile()
        self.compiled.append(name)
        if self.storing and path is not None:
            self._store(path, compiled)
        return compiled

    def _load(self, path: Path) -> Any:
        try:
            if path.stat().st_uid != os.geteuid():
                _say(f"compiled program {path.name} belongs to another user; compiling")
                return None
            payload, in_tree, out_tree = pickle.loads(path.read_bytes())
            return serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
        except FileNotFoundError:
            return None
        except Exception as error:  # another jaxlib, a damaged file: compile again
            _say(f"compiled program {path.name} not loadable ({error!r}); compiling")
            return None

    def _store(self, path: Path, compiled: Any) -> None:
        try:
            payload = pickle.dumps(serialize_executable.serialize(compiled))
            with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as out:
                out.write(payload)
            os.replace(out.name, path)
        except Exception as error:  # a full disk or an unserializable program costs a compile, no more
            _say(f"could not store compiled program {path.name}: {error!r}")


def _lowered(lowering: Lowering) -> Any:
    return lowering() if callable(lowering) and not hasattr(lowering, "compile") else lowering


def untrusted(directory: Path) -> str | None:
    """Why programs in `directory` must not be unpickled, or None: it must be this user's, and
    writable by nobody else."""
    info = directory.stat()
    if info.st_uid != os.geteuid():
        return f"it belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"others may write to it (mode {stat.filemode(info.st_mode)}); make it private (chmod 700)"
    return None


def _say(text: str) -> None:
    print(f"slicekeeper: {text}", file=sys.stderr, flush=True)
