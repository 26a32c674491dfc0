"""The suite's file order for pytest-xdist (tests/support/schedule.py): the files it names exist, and
the longest go first with each file's tests kept together in their order."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests.support.cli_runs import ROOT
from tests.support.schedule import LONGEST_FILES, longest_first


def test_every_file_the_schedule_names_exists():
    assert [name for name in LONGEST_FILES if not (ROOT / name).is_file()] == []


def test_the_longest_files_go_first_and_each_file_keeps_its_tests_together_in_order():
    names = [
        "tests/unit/test_a.py::one",
        "tests/chaos/test_jax_recovery.py::one",
        "tests/unit/test_a.py::two",
        "tests/operator/test_operator_training.py::one",
        "tests/chaos/test_jax_recovery.py::two",
        "tests/unit/test_b.py::one",
    ]
    items: list[Any] = [SimpleNamespace(nodeid=name) for name in names]
    longest_first(items)
    assert [item.nodeid for item in items] == [
        "tests/operator/test_operator_training.py::one",
        "tests/chaos/test_jax_recovery.py::one",
        "tests/chaos/test_jax_recovery.py::two",
        "tests/unit/test_a.py::one",
        "tests/unit/test_a.py::two",
        "tests/unit/test_b.py::one",
    ]
