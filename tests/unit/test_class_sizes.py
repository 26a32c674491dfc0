"""No class of the supervisors or the operator is a hub, checked with `ast`.

A class that holds many attributes is one that many parts lean on, and grows getters for whatever in
it changes (`accountant=lambda: self.accountant`). Moving attributes into dataclass fields does not
make a class smaller, so a class's size is its attributes and its fields together, the distinct names
of both:

- an attribute is a name of `self` that a method of the class assigns (a nested class's count too),
  counted once however often it is assigned: `self.x = ...`, `self.x: T = ...`, `self.x += ...`, and
  each target of a tuple assignment (`self.x[k] = ...` and `self.x.y = ...` change what `x` holds,
  they assign no attribute of `self`);
- a field is an annotated name in the class's own body, with or without a value: a dataclass field, a
  pydantic model field (its private attributes too), a NamedTuple, TypedDict or Protocol member.
  `ClassVar[...]` and `InitVar[...]` are not fields (the one belongs to the class, the other is only an
  argument of `__init__`); neither are methods, nor unannotated class-level names (constants, enum
  members), which no instance holds.

Rule A: no class under supervisor/ or operator/ has more than MOST_ATTRIBUTES_AND_FIELDS.
Rule B: a behaviour class has no more than MOST_OF_A_BEHAVIOUR. A record is exempt from rule B: a class
decorated with `@dataclass` (any form), or deriving, by a base's name, from pydantic's `BaseModel`,
`NamedTuple`, `TypedDict`, an `Enum`, an exception (`Exception`, `BaseException`, a name ending in
`Error` or `Exception`) or from another record class of the same tree; and whose methods assign no
attribute of `self` but its own fields and what `__post_init__` or `model_post_init` derived from them
(a record's methods may change its data, never hold more). Every other class is a behaviour. The
host's supervisor, which owns only what belongs to the machine and its process (the host it serves is
a mode with its own parts, supervisor.host), holds no more than HOST_SUPERVISOR_ATTRIBUTES.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli_runs import ROOT

TREES = (ROOT / "supervisor", ROOT / "operator")
MOST_ATTRIBUTES_AND_FIELDS = 20
MOST_OF_A_BEHAVIOUR = 15
HOST_SUPERVISOR = "supervisor/host/supervisor.py:HostSupervisor"
HOST_SUPERVISOR_ATTRIBUTES = 15

RECORD_BASES = frozenset(
    {
        "BaseModel",
        "NamedTuple",
        "TypedDict",
        "Enum",
        "IntEnum",
        "StrEnum",
        "Flag",
        "IntFlag",
        "Exception",
        "BaseException",
    }
)
NOT_FIELDS = frozenset({"ClassVar", "InitVar"})
RECORD_INITIALISERS = frozenset({"__post_init__", "model_post_init"})


@dataclasses.dataclass(frozen=True)
class ClassSize:
    """One class's attributes and fields, and whether it is a record."""

    attributes: frozenset[str]
    fields: frozenset[str]
    record: bool

    @property
    def count(self) -> int:
        return len(self.attributes | self.fields)


def _self_targets(statement: ast.AST) -> Iterator[str]:
    """The attributes of `self` that `statement` assigns, if it is an assignment."""
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
        targets = [statement.target]
    else:
        return
    targets = list(targets)
    while targets:
        target = targets.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            targets.extend(target.elts)
        elif isinstance(target, ast.Starred):
            targets.append(target.value)
        elif (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
        ):
            yield target.attr


def self_attributes(node: ast.ClassDef, *, outside: frozenset[str] = frozenset()) -> set[str]:
    """The attributes of `self` that the methods of class `node` assign (a nested class's count too),
    leaving out the methods named in `outside`."""
    assigned: set[str] = set()
    skipped = [
        statement
        for statement in node.body
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name in outside
    ]
    skipped_nodes = {id(inner) for method in skipped for inner in ast.walk(method)}
    for statement in ast.walk(node):
        if id(statement) not in skipped_nodes:
            assigned.update(_self_targets(statement))
    return assigned


def _annotation_head(annotation: ast.expr) -> str:
    """The outermost name of an annotation: `ClassVar` for `ClassVar[int]`, `typing.ClassVar`, or the
    string `"ClassVar[int]"`."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return ""
    if isinstance(annotation, ast.Subscript):
        annotation = annotation.value
    if isinstance(annotation, ast.Attribute):
        return annotation.attr
    if isinstance(annotation, ast.Name):
        return annotation.id
    return ""


def fields(node: ast.ClassDef) -> set[str]:
    """The annotated names of class `node`'s own body, less ClassVar and InitVar."""
    return {
        statement.target.id
        for statement in node.body
        if isinstance(statement, ast.AnnAssign)
        and isinstance(statement.target, ast.Name)
        and _annotation_head(statement.annotation) not in NOT_FIELDS
    }


def _name(expression: ast.expr) -> str:
    """The last name of `expression`: `dataclass` for `dataclasses.dataclass(frozen=True)`."""
    if isinstance(expression, ast.Call):
        expression = expression.func
    if isinstance(expression, ast.Subscript):
        expression = expression.value
    if isinstance(expression, ast.Attribute):
        return expression.attr
    if isinstance(expression, ast.Name):
        return expression.id
    return ""


def _bases(node: ast.ClassDef) -> set[str]:
    return {_name(base) for base in node.bases}


def _record_shaped(node: ast.ClassDef, records: set[str]) -> bool:
    """Whether `node` is declared as a record: a dataclass, or derived from a record base."""
    if any(_name(decorator) == "dataclass" for decorator in node.decorator_list):
        return True
    return any(
        base in RECORD_BASES or base in records or base.endswith(("Error", "Exception"))
        for base in _bases(node)
    )


def class_sizes(sources: dict[str, str]) -> dict[str, ClassSize]:
    """`where:Class` -> its size, for every class of `sources` (`where` -> source text). A class whose
    base is a record class of `sources` (found by name) is record-shaped too."""
    found = [
        (where, node)
        for where, source in sources.items()
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef)
    ]
    record_shaped: set[str] = set()
    grown = True
    while grown:
        grown = False
        for _, node in found:
            if node.name not in record_shaped and _record_shaped(node, record_shaped):
                record_shaped.add(node.name)
                grown = True
    sizes = {}
    for where, node in found:
        # A record's methods may change its own fields and what `__post_init__` derived from them,
        # never hold anything more.
        initialisers = [
            item
            for item in node.body
            if isinstance(item, ast.FunctionDef) and item.name in RECORD_INITIALISERS
        ]
        derived = {
            element.attr
            for method in initialisers
            for element in ast.walk(method)
            if isinstance(element, ast.Attribute)
            and isinstance(element.ctx, ast.Store)
            and isinstance(element.value, ast.Name)
            and element.value.id == "self"
        }
        held = self_attributes(node, outside=RECORD_INITIALISERS) - set(fields(node)) - derived
        record = node.name in record_shaped and not held
        sizes[f"{where}:{node.name}"] = ClassSize(
            frozenset(self_attributes(node)), frozenset(fields(node)), record
        )
    return sizes


def classes(source: str) -> Iterator[tuple[str, int]]:
    """Each class of `source`, with its attributes and fields together."""
    for name, size in class_sizes({"": source}).items():
        yield name.removeprefix(":"), size.count


def tree_sizes() -> dict[str, ClassSize]:
    """`path:Class` -> size, for every class under supervisor/ and operator/."""
    sources = {
        str(path.relative_to(ROOT)): path.read_text()
        for tree in TREES
        for path in sorted(Path(tree).rglob("*.py"))
    }
    return class_sizes(sources)


def hubs(sizes: dict[str, ClassSize]) -> dict[str, int]:
    """Rule A's violators: more than MOST_ATTRIBUTES_AND_FIELDS attributes and fields."""
    return {name: size.count for name, size in sizes.items() if size.count > MOST_ATTRIBUTES_AND_FIELDS}


def large_behaviours(sizes: dict[str, ClassSize]) -> dict[str, int]:
    """Rule B's violators: a behaviour class with more than MOST_OF_A_BEHAVIOUR."""
    return {
        name: size.count
        for name, size in sizes.items()
        if not size.record and size.count > MOST_OF_A_BEHAVIOUR
    }


def test_both_trees_have_classes_of_every_kind():
    sizes = tree_sizes()
    for tree in ("supervisor/", "operator/"):
        assert any(name.startswith(tree) for name in sizes), f"no class found under {tree}"
    assert any(size.record and size.fields for size in sizes.values()), "no record with fields found"
    assert any(not size.record and size.attributes for size in sizes.values()), "no behaviour found"


def test_no_class_holds_more_than_twenty_attributes_and_fields():
    too_many = hubs(tree_sizes())
    assert not too_many, (
        f"classes with more than {MOST_ATTRIBUTES_AND_FIELDS} attributes and fields: {too_many}; split them "
        "by job, and hand parts a frozen context instead of getters"
    )


def test_no_behaviour_holds_more_than_fifteen_attributes_and_fields():
    too_many = large_behaviours(tree_sizes())
    assert not too_many, (
        f"behaviour classes with more than {MOST_OF_A_BEHAVIOUR} attributes and fields: {too_many}; split "
        "them by job (a frozen record of options, parts that each own one concern)"
    )


def test_the_host_supervisor_holds_only_what_belongs_to_the_machine():
    count = tree_sizes()[HOST_SUPERVISOR].count
    assert count <= HOST_SUPERVISOR_ATTRIBUTES, (
        f"HostSupervisor holds {count} attributes and fields (at most {HOST_SUPERVISOR_ATTRIBUTES}): what "
        "serves one host belongs to supervisor.host.served_host"
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
        ("class A:\n    def f(self):\n        self.a[1] = 1\n        self.b.c += 1", 0),
        ("class A:\n    def f(self):\n        [self.a, *self.b] = 1, 2", 2),
    ],
    ids=[
        "assigned-twice",
        "annotated-and-augmented",
        "tuple-targets",
        "chained",
        "not-self",
        "only-read",
        "what-an-attribute-holds-changed",
        "list-and-starred-targets",
    ],
)
def test_every_form_of_an_attribute_assignment_is_counted(source, count):
    assert [c for _, c in classes(source)] == [count]


@pytest.mark.parametrize(
    ("source", "count", "record"),
    [
        (
            "@dataclass(frozen=True)\nclass A:\n    a: int\n    b: str = ''\n"
            "    c: list = field(default_factory=list)",
            3,
            True,
        ),
        ("@dataclasses.dataclass\nclass A:\n    a: int\n    def f(self):\n        return self.a", 1, True),
        (
            "class A(BaseModel):\n    a: int\n    b: str = Field(default='')\n    _c: int = PrivateAttr(0)",
            3,
            True,
        ),
        ("class A(NamedTuple):\n    a: int\n    b: int", 2, True),
        ("class A(typing.TypedDict, total=False):\n    a: int", 1, True),
        ("class A(enum.Enum):\n    X = 'x'\n    Y = 'y'", 0, True),
        ("class A(ValueError):\n    def __init__(self, why):\n        super().__init__(why)", 0, True),
        ("class A:\n    def __init__(self):\n        self.a = 1\n        self.b = 2", 2, False),
        ("class A:\n    a: int\n    def __init__(self):\n        self.a = 1\n        self.b = 2", 2, False),
        (
            "@dataclass\nclass A:\n    a: int\n    k: ClassVar[int] = 1\n    t: typing.ClassVar[str] = ''\n"
            "    s: 'ClassVar[int]' = 2\n    i: InitVar[int] = 0\n    C = 3\n    def f(self):\n        pass",
            1,
            True,
        ),
        (
            "@dataclass\nclass A:\n    a: int\n    def __post_init__(self):\n        self.b = 2 * self.a",
            2,
            True,
        ),
        ("@dataclass\nclass A:\n    a: int\n    def grow(self):\n        self.b = 2 * self.a", 2, False),
        ("@dataclass\nclass A:\n    a: int\n    def grow(self):\n        self.a += 1", 1, True),
        (
            "@dataclass\nclass A:\n    a: int\n    def __post_init__(self):\n        self.b = 0\n"
            "    def grow(self):\n        self.b = self.a",
            2,
            True,
        ),
    ],
    ids=[
        "dataclass-fields",
        "dataclass-reading-its-fields",
        "pydantic-fields-and-private-attributes",
        "named-tuple",
        "typed-dict",
        "enum-members-are-not-fields",
        "exception",
        "behaviour-attributes",
        "annotation-and-assignment-count-once",
        "class-variables-init-variables-constants-and-methods-are-not-fields",
        "post-init-keeps-a-record",
        "assigning-outside-post-init-is-a-behaviour",
        "changing-its-own-field-keeps-a-record",
        "changing-what-post-init-derived-keeps-a-record",
    ],
)
def test_fields_and_attributes_are_counted_together(source, count, record):
    [size] = class_sizes({"": source}).values()
    assert (size.count, size.record) == (count, record)


def test_a_subclass_of_a_record_of_the_tree_is_a_record():
    sizes = class_sizes(
        {
            "a.py": "class Base(BaseModel):\n    a: int",
            "b.py": "class Sub(Base):\n    b: int",
            "c.py": "class Other(Unknown):\n    c: int",
        }
    )
    assert {name: (size.count, size.record) for name, size in sizes.items()} == {
        "a.py:Base": (1, True),
        "b.py:Sub": (1, True),
        "c.py:Other": (1, False),
    }


def test_the_rules_catch_a_large_behaviour_and_a_large_record():
    """Negative controls: the rules fail a behaviour with 16 attributes and a dataclass with 21 fields,
    and pass a behaviour with 15 and a dataclass with 20."""

    def behaviour(n: int) -> str:
        return "class B:\n    def __init__(self):\n" + "".join(f"        self.a{i} = {i}\n" for i in range(n))

    def record(n: int) -> str:
        return "@dataclass(frozen=True)\nclass R:\n" + "".join(f"    f{i}: int = {i}\n" for i in range(n))

    sizes = class_sizes({"big.py": behaviour(16) + record(21), "fits.py": behaviour(15) + record(20)})
    assert large_behaviours(sizes) == {"big.py:B": 16}
    assert hubs(sizes) == {"big.py:R": 21}
