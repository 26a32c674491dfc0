"""Tests that must have the machine to themselves while the suite runs on several workers.

`make test` runs the suite on as many pytest-xdist workers as the machine has cores. A few tests
compare what two runs measured (the simulator predicting one run from another's recovery costs, an
announced loss costing less badput than the same loss unannounced): each run must see the same load,
which another worker's run would change. Such a test is marked `alone`; while it runs (its fixtures
included), no other test does, and it waits for the tests under way to end (consecutive alone tests
of a worker share that wait: `Turns`). A test marked `heavy`
(a run of several JAX or torch processes) waits for one of HEAVY_AT_ONCE slots.

The lock is a readers-writer lock over two `flock`ed files of the test run (shared by its workers):
every test holds the gate while it takes its share, and an `alone` test holds the gate until it has
the whole, so that tests starting meanwhile wait behind it instead of starving it. Without workers
(one pytest process) there is nothing to wait for, and no lock is taken.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

MARK = "alone"
HEAVY = "heavy"
HEAVY_AT_ONCE = 2
"""Tests marked `heavy` (a run of several JAX or torch processes: compiling, then steps whose times
its detectors judge) that run at once, at most, on this 2-core machine. A third beside them starved
all three: programs compiled in 40-60 s instead of 3-4, and hangs were found where there were none."""
SLOT_WAIT_SECONDS = 0.2
RUN_ID = "PYTEST_XDIST_TESTRUNUID"
"""Set by pytest-xdist in each worker, the same for every worker of one test run."""
BASE = Path(tempfile.gettempdir())
"""The system's temporary directory as the workers start (read at import, before each worker's
session points TMPDIR at a tree of its own, tests/conftest.py)."""


def lock_directory() -> Path | None:
    """Where this test run's lock files lie (None: not run by pytest-xdist workers)."""
    run = os.environ.get(RUN_ID)
    if not run:
        return None
    where = BASE / f"slicekeeper-tests-{run}"
    where.mkdir(exist_ok=True)
    return where


@contextlib.contextmanager
def turn(alone: bool, where: Path | None = None) -> Iterator[None]:
    """Hold this test's turn: a share of the machine, or (`alone`) all of it."""
    where = where if where is not None else lock_directory()
    if where is None:
        yield
        return
    with open(where / "gate", "a") as gate, open(where / "machine", "a") as machine:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(gate, fcntl.LOCK_UN)


class Turns:
    """One worker's turns, test after test: consecutive `alone` tests (the tests of one file marked
    `alone`, which pytest-xdist's `--dist loadfile` hands to one worker in a row) share one turn. Each
    alone turn first waits for every test under way to end, the other workers idle meanwhile; one
    wait a file, not one a test."""

    def __init__(self, where: Path | None = None) -> None:
        self._where = where
        self._alone: contextlib.ExitStack | None = None
        """The alone turn held over from the previous test (None: none is)."""

    @contextlib.contextmanager
    def test(self, is_alone: bool, next_is_alone: bool) -> Iterator[None]:
        """Hold this test's turn; an alone one is kept for the next test when that one is alone too."""
        if not is_alone:
            self.end()
            with turn(False, self._where):
                yield
            return
        if self._alone is None:
            held = contextlib.ExitStack()
            held.enter_context(turn(True, self._where))
            self._alone = held
        try:
            yield
        finally:
            if not next_is_alone:
                self.end()

    def end(self) -> None:
        """Give back an alone turn held over (at the end of the stretch, or of the session)."""
        if self._alone is not None:
            held, self._alone = self._alone, None
            held.close()


@contextlib.contextmanager
def heavy_slot(heavy: bool, where: Path | None = None) -> Iterator[None]:
    """Hold one of the HEAVY_AT_ONCE slots for a `heavy` test (nothing for another, or without
    workers)."""
    where = where if where is not None else lock_directory()
    if not heavy or where is None:
        yield
        return
    with contextlib.ExitStack() as files:
        slots = [files.enter_context(open(where / f"heavy-{i}", "a")) for i in range(HEAVY_AT_ONCE)]
        while True:
            for slot in slots:
                try:
                    fcntl.flock(slot, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                try:
                    yield
                finally:
                    fcntl.flock(slot, fcntl.LOCK_UN)
                return
            time.sleep(SLOT_WAIT_SECONDS)
