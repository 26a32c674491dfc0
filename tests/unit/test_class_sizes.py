"""No class of the supervisors is a hub, checked with `ast`.

A class that holds many attributes is one that many parts lean on, and grows getters for whatever in
it changes (`accountant=lambda: self.accountant`). So no class under supervisor/ assigns more than
MOST_ATTRIBUTES distinct attributes of `self`, and the host's supervisor, which owns only what belongs
to the machine and its process (the host it serves is a mode with its own parts, supervisor.host),
no more than HOST_SUPERVISOR_ATTRIBUTES. An attribute counts once however often it is assigned:
`self.x = ...`, `self.x: T = ...`, `self.x += ...`, and each target of a tuple assignment.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

import pytest

from tests.support.cli_runs import ROOT

SUPERVISORS = ROOT / "supervisor"
MOST_ATTRIBUTES = 20
HOST_SUPERVISOR = "supervisor/host/supervisor.py:HostSupervisor"
HOST_SUPERVISOR_ATTRIBUTES = 15


def self_attributes(node: ast.ClassDef) -> set[str]:
    """The attributes of `self` that the methods of class `node` assign (a nested class's count too)."""
    assigned = set()
    for statement in ast.walk(node):
        if isinstance(statement, ast.Assign):
            targets = statement.targets
        elif isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
            targets = [statement.target]
        else:
            continue
        for target in targets:
            for element in ast.walk(target):
                if (
                    isinstance(element, ast.Attribute)
                    and isinstance(element.value, ast.Name)
                    and element.value.id == "self"
                ):
                    assigned.add(element.attr)
    return assigned


def classes(source: str) -> Iterator[tuple[str, int]]:
    """Each class of `source`, with the number of attributes its methods assign."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            yield node.name, len(self_attributes(node))


def attribute_counts() -> dict[str, int]:
    """`path:Class` -> attributes, for every class under supervisor/."""
    counts = {}
    for path in sorted(SUPERVISORS.rglob("*.py")):
        where = path.relative_to(ROOT)
        for name, count in classes(path.read_text()):
            counts[f"{where}:{name}"] = count
    return counts


def test_no_class_of_the_supervisors_holds_more_than_twenty_attributes():
    counts = attribute_counts()
    assert counts, "no class found under supervisor/"
    hubs = {name: count for name, count in counts.items() if count > MOST_ATTRIBUTES}
    assert not hubs, (
        f"classes assigning more than {MOST_ATTRIBUTES} attributes of self: {hubs}; split them by job, "
        "and hand parts a frozen context instead of getters"
    )


def test_the_host_supervisor_holds_only_what_belongs_to_the_machine():
    count = attribute_counts()[HOST_SUPERVISOR]
    assert count <= HOST_SUPERVISOR_ATTRIBUTES, (
        f"HostSupervisor assigns {count} attributes (at most {HOST_SUPERVISOR_ATTRIBUTES}): what serves "
        "one host belongs to supervisor.host.served_host"
    )


@pytest.mark.parametrize(
    ("source", "count"),
    [
        ("class A:\n    def f(self):\n        self.a = 1\n        self.a = 2", 1),
        ("class A:\n    def f(self):\n        self.a: int = 1\n        self.b += 1", 2),
        ("class A:\n    def f(self):\n        self.a, (self.b, self.c) = 1, (2, 3)", 3),
        ("class A:\n    def f(self):\n        self.a = self.b = 0", 2),
        ("class A:\n    def f(self, other):\n        other.a = 1", 0),
        ("class A:\n    x = 1\n    def f(self):\n        y = self.z", 0),
    ],
    ids=["assigned-twice", "annotated-and-augmented", "tuple-targets", "chained", "not-self", "only-read"],
)
def test_every_form_of_an_attribute_assignment_is_counted(source, count):
    assert [c for _, c in classes(source)] == [count]
