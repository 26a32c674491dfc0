"""The order `make test` hands the suite's files to its workers (tests/support/file_order.py)."""

from __future__ import annotations

from dataclasses import dataclass

from tests.support.file_order import in_file_order


@dataclass(frozen=True)
class Item:
    nodeid: str
    marks: frozenset[str] = frozenset()

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.marks else None


def file_tests(file: str, count: int, *marks: str) -> list[Item]:
    return [Item(f"{file}::test_{n}", frozenset(marks)) for n in range(count)]


def files(items: list[Item]) -> list[str]:
    return list(dict.fromkeys(item.nodeid.split("::")[0] for item in items))


def test_a_long_file_with_no_heavy_test_goes_first_and_the_rest_most_tests_first() -> None:
    items = [
        *file_tests("unit.py", 30),
        *file_tests("heavy_runs.py", 2, "slow", "heavy"),
        *file_tests("kill_points.py", 1, "slow"),
        *file_tests("cli.py", 5),
    ]
    ordered = in_file_order(items)
    assert files(ordered) == ["kill_points.py", "unit.py", "cli.py", "heavy_runs.py"]
    assert sorted(ordered, key=items.index) == items  # nothing lost or doubled


def test_a_file_whose_slow_tests_sit_beside_a_heavy_one_keeps_its_place() -> None:
    mixed = [*file_tests("mixed.py", 2, "slow"), *file_tests("mixed.py", 1, "heavy")]
    ordered = in_file_order([*file_tests("unit.py", 4), *mixed, *file_tests("long.py", 1, "slow")])
    assert files(ordered) == ["long.py", "unit.py", "mixed.py"]


def test_each_files_tests_keep_their_order_and_stay_together() -> None:
    interleaved = [Item("a.py::x"), Item("b.py::y"), Item("a.py::z", frozenset({"slow"}))]
    assert [t.nodeid for t in in_file_order(interleaved)] == ["a.py::x", "a.py::z", "b.py::y"]
