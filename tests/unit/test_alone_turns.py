"""A test marked `alone` runs with no other test beside it under pytest-xdist (tests/support/alone.py),
and tests that start while it waits for its turn wait behind it rather than starving it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.support import alone

HOLD = 0.3
"""How long each turn is held: long enough that a turn taken out of order would overlap another."""


def _take(
    where: Path, name: str, is_alone: bool, log: list[tuple[str, str]], started: threading.Event
) -> None:
    started.set()
    with alone.turn(is_alone, where):
        log.append(("begin", name))
        time.sleep(HOLD)
        log.append(("end", name))


def _start(where: Path, name: str, is_alone: bool, log: list[tuple[str, str]]) -> threading.Thread:
    started = threading.Event()
    thread = threading.Thread(target=_take, args=(where, name, is_alone, log, started))
    thread.start()
    started.wait()
    time.sleep(0.05)  # it is waiting for its turn, or in it
    return thread


def _overlapping(log: list[tuple[str, str]]) -> set[frozenset[str]]:
    inside: set[str] = set()
    pairs: set[frozenset[str]] = set()
    for what, name in log:
        if what == "begin":
            pairs |= {frozenset({name, other}) for other in inside}
            inside.add(name)
        else:
            inside.discard(name)
    return pairs


@pytest.mark.parametrize("first_alone", [True, False], ids=["alone-first", "shared-first"])
def test_an_alone_turn_never_overlaps_another(tmp_path, first_alone):
    log: list[tuple[str, str]] = []
    first = _start(tmp_path, "first", first_alone, log)
    second = _start(tmp_path, "second", not first_alone, log)
    first.join(), second.join()
    assert _overlapping(log) == set()
    assert [name for what, name in log if what == "begin"] == ["first", "second"]


def test_shared_turns_overlap_and_a_later_one_waits_behind_an_alone_one(tmp_path):
    log: list[tuple[str, str]] = []
    threads = [_start(tmp_path, "shared-1", False, log), _start(tmp_path, "shared-2", False, log)]
    threads.append(_start(tmp_path, "alone", True, log))  # waits for both, holding the gate
    threads.append(_start(tmp_path, "shared-3", False, log))  # came later: after the alone one
    for thread in threads:
        thread.join()
    assert _overlapping(log) == {frozenset({"shared-1", "shared-2"})}  # the negative control: they do
    begins = [name for what, name in log if what == "begin"]
    assert begins.index("alone") < begins.index("shared-3")


def test_without_workers_no_lock_is_taken(monkeypatch):
    monkeypatch.delenv(alone.RUN_ID, raising=False)
    assert alone.lock_directory() is None
    with alone.turn(True), alone.turn(True):  # nested: would deadlock if it locked anything
        pass


def _heavy(where: Path, name: str, log: list[tuple[str, str]]) -> threading.Thread:
    def take() -> None:
        with alone.heavy_slot(True, where):
            log.append(("begin", name))
            time.sleep(HOLD)
            log.append(("end", name))

    thread = threading.Thread(target=take)
    thread.start()
    time.sleep(0.05)
    return thread


def test_heavy_tests_run_two_at_once_and_a_third_waits_for_a_slot(tmp_path):
    log: list[tuple[str, str]] = []
    threads = [_heavy(tmp_path, f"heavy-{index}", log) for index in range(3)]
    for thread in threads:
        thread.join()
    inside, most = 0, 0
    for what, _ in log:
        inside += 1 if what == "begin" else -1
        most = max(most, inside)
    assert most == alone.HEAVY_AT_ONCE  # the negative control: two did run at once
    first_end = min(log.index(("end", "heavy-0")), log.index(("end", "heavy-1")))
    assert log.index(("begin", "heavy-2")) > first_end


@pytest.mark.parametrize("shared", [True, False], ids=["one-turn-for-the-stretch", "a-turn-a-test"])
def test_consecutive_alone_tests_of_a_worker_share_one_turn(tmp_path, shared):
    """A worker runs two alone tests in a row (one file's) while another worker's test waits to start:
    it starts after both, not between them (each alone turn waits for the machine to empty, so a turn
    a test would drain it twice). The negative control takes a turn a test: the other slips between."""
    log: list[tuple[str, str]] = []

    def worker() -> None:
        turns = alone.Turns(tmp_path)
        for name, next_is_alone in (("alone-1", shared), ("alone-2", False)):
            with turns.test(True, next_is_alone):
                log.append(("begin", name))
                time.sleep(HOLD)
                log.append(("end", name))
            time.sleep(0.05)  # between two tests: pytest's own work

    first = threading.Thread(target=worker)
    first.start()
    time.sleep(0.05)  # alone-1 holds the machine
    other = _start(tmp_path, "other", False, log)
    first.join(), other.join()
    begins = [name for what, name in log if what == "begin"]
    assert begins == (["alone-1", "alone-2", "other"] if shared else ["alone-1", "other", "alone-2"])
    assert _overlapping(log) == set()
