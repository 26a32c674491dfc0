"""The order pytest-xdist hands the suite's files to its workers: long light files first.

`make test` runs each file on one worker (`--dist loadfile`) and hands the files out in the order
collected (`--no-loadscope-reorder`), which this module sets. pytest-xdist's own order (the files
with the most tests first) handed out the single-test files last, and two of them are long: the
operator's kill points (a job's hot-swap and scaling walked with the operator killed after each
write, about 120 s, mostly waiting) and its resume (three runs of a job). They then ran alone at
the end with the other workers done (stop 54: the last 115 s of the suite on one worker).

A file with a test marked `slow` (a whole run or several) and none marked `heavy` goes first: it
needs no heavy slot (tests/support/alone.py), so it starts at once, beside whatever runs. The
files with `heavy` tests keep xdist's place among the short ones: handed out first, three of them
waited for two slots with their workers idle, and ran together (e067877, docs/testing.md). Within
each group, xdist's order: the files with the most tests first, ties in the order collected.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

SLOW = "slow"
HEAVY = "heavy"


class Marked(Protocol):
    """What the order reads of a test: its file and its markers (a pytest.Item is one)."""

    @property
    def nodeid(self) -> str: ...

    def get_closest_marker(self, name: str) -> object | None: ...


Test = TypeVar("Test", bound=Marked)


def file_of(item: Marked) -> str:
    return item.nodeid.split("::", 1)[0]


def in_file_order(items: Sequence[Test]) -> list[Test]:
    """`items` grouped by file, the files in the order above; each file's tests in their order."""
    files: dict[str, list[Test]] = {}
    for item in items:
        files.setdefault(file_of(item), []).append(item)

    def long_and_light(tests: list[Test]) -> bool:
        marked = [
            (t.get_closest_marker(SLOW) is not None, t.get_closest_marker(HEAVY) is not None) for t in tests
        ]
        return any(slow for slow, _ in marked) and not any(heavy for _, heavy in marked)

    order = sorted(files.values(), key=lambda tests: (not long_and_light(tests), -len(tests)))
    return [item for tests in order for item in tests]
