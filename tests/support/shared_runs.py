"""Expensive session fixtures made once per test run, not once per pytest-xdist worker.

A session fixture is made once in each worker process that needs it: with three workers the
fault-free run of the example job (about 25 s of CPU) ran three times, each a third worker's load on
the same two cores. `once_per_run` makes it in the first worker that asks, under a lock of the test
run (tests/support/alone.py's folder), in a folder of the run's temporary tree that every worker
reads (pytest's numbered session folder, pruned with the rest); the others wait for the lock and read
its pickled value. A make that fails leaves nothing behind: the next worker that asks makes it again
(and fails the same way, in its own test). Without workers it is a plain call.
"""

from __future__ import annotations

import fcntl
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from tests.support import alone

T = TypeVar("T")
VALUE_FILE = "value.pickle"


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], T]) -> T:
    """`make(folder)`, made once per test run whatever the number of workers; the same value (a
    picklable one) in every worker."""
    locks = alone.lock_directory()
    if locks is None:
        return make(tmp_path_factory.mktemp(name))
    # The workers' base folders are popen-gw0, popen-gw1, ... of one session folder.
    folder = tmp_path_factory.getbasetemp().parent / f"shared-{name}"
    with open(locks / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = folder / VALUE_FILE
        if made.exists():
            return pickle.loads(made.read_bytes())  # type: ignore[no-any-return]
        shutil.rmtree(folder, ignore_errors=True)  # a make that failed in another worker
        folder.mkdir(parents=True)
        value = make(folder)
        partial = made.with_suffix(".partial")
        partial.write_bytes(pickle.dumps(value))
        partial.rename(made)
        return value
