"""The code's vocabulary, checked with `ast`: one word, one meaning; one place for one decision.

- A number of hosts is a count, `host_count` (or `hosts_per_slice`, `full_hosts`, ...): no parameter
  or field named `hosts` is annotated `int` (hosts as a collection, a tuple or a list, keep the name).
- Local or cluster is decided once, in supervisor/host/site.py: no other module of the supervisors
  branches on a name `local`, nor on whether `replacement_timeout` is None (the site gives the leader
  its way to a lost host's successor, spare supervisors or a new pod).

Every Python file of the packages is read: a name in a string or a comment does not count.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.cli_runs import ROOT

PACKAGES = ("slicekeeper", "operator", "supervisor", "workload")
SUPERVISORS = ROOT / "supervisor"
SITE = SUPERVISORS / "host" / "site.py"
LOCAL = re.compile(r"^_?(is_)?local$")
"""A name that says "a local run": `local`, `_local`, `is_local`."""
OPTIONAL = ("Optional", "typing.Optional")


def sources(*folders: Path) -> Iterator[Path]:
    for folder in folders:
        yield from sorted(folder.rglob("*.py"))


def _is_int(annotation: ast.expr | None) -> bool:
    """`int`, `int | None`, `Optional[int]` (what a count of hosts would be annotated)."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return _is_int(ast.parse(annotation.value, mode="eval").body)
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        sides = (annotation.left, annotation.right)
        return any(_is_int(side) for side in sides) and all(_is_int(s) or _is_none(s) for s in sides)
    if isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) in OPTIONAL:
        return _is_int(annotation.slice)
    return isinstance(annotation, ast.Name) and annotation.id == "int"


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def host_counts_named_hosts(source: str) -> list[int]:
    """Lines of `source` with a parameter, or a field (`hosts: int` in a class, `self.hosts: int`),
    named `hosts` and annotated as an int."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
            lines += [a.lineno for a in every if a.arg == "hosts" and _is_int(a.annotation)]
        elif isinstance(node, ast.AnnAssign) and _is_int(node.annotation):
            target = node.target
            name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)
            if name == "hosts":
                lines.append(node.lineno)
    return lines


def _tests(tree: ast.AST) -> Iterator[ast.expr]:
    """Every expression the code branches on: if, elif, while, ternary, comprehension filter, match."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert)):
            yield node.test
        elif isinstance(node, ast.comprehension):
            yield from node.ifs
        elif isinstance(node, ast.Match):
            yield node.subject


def _names(expression: ast.expr) -> Iterator[str]:
    for node in ast.walk(expression):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr


def _flags(expression: ast.expr) -> Iterator[str]:
    """The names in `expression` whose value it tests (`plan.local`), not the ones it reads a field of
    (`spec.local.hosts`: the spec's section for local runs)."""
    owners = {id(node.value) for node in ast.walk(expression) if isinstance(node, ast.Attribute)}
    for node in ast.walk(expression):
        if id(node) in owners:
            continue
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr


def local_branches(source: str) -> list[int]:
    """Lines of `source` that branch on a name saying "a local run" (see LOCAL)."""
    return sorted(
        test.lineno for test in _tests(ast.parse(source)) if any(LOCAL.match(n) for n in _flags(test))
    )


def replacement_timeout_none_branches(source: str) -> list[int]:
    """Lines of `source` that branch on whether a `replacement_timeout` is None (or is set at all)."""
    found = []
    for test in _tests(ast.parse(source)):
        for node in ast.walk(test):
            named = isinstance(node, (ast.Name, ast.Attribute)) and "replacement_timeout" in _names(node)
            compared = isinstance(node, ast.Compare) and any(
                "replacement_timeout" in _names(side) for side in (node.left, *node.comparators)
            )
            to_none = compared and any(_is_none(c) for c in (node.left, *node.comparators))
            if to_none or (named and node is test):
                found.append(test.lineno)
                break
    return sorted(found)


def _found_in(
    folders: list[Path], rule: Callable[[str], list[int]], skipped: frozenset[Path] = frozenset()
) -> dict[str, list[int]]:
    found = {}
    for path in sources(*folders):
        if path not in skipped and (lines := rule(path.read_text())):
            found[str(path.relative_to(ROOT))] = lines
    return found


def test_a_number_of_hosts_is_never_called_hosts():
    found = _found_in([ROOT / package for package in PACKAGES], host_counts_named_hosts)
    assert not found, (
        f"parameters or fields named `hosts` annotated int (file: lines): {found}; a number of hosts is "
        "`host_count` (or says which hosts: `hosts_per_slice`, `full_hosts`), `hosts` is a collection"
    )


def test_local_or_cluster_is_decided_only_by_the_site():
    assert SITE.is_file()
    found = _found_in([SUPERVISORS], local_branches, frozenset({SITE}))
    assert not found, (
        f"branches on a local run outside supervisor/host/site.py (file: lines): {found}; ask the "
        "site (supervisor.host.site.Site) what differs instead"
    )


def test_the_leader_is_given_its_replacements_and_never_infers_them_from_a_missing_timeout():
    found = _found_in([SUPERVISORS], replacement_timeout_none_branches, frozenset({SITE}))
    assert not found, (
        f"branches on whether replacement_timeout is None (file: lines): {found}; the site builds the "
        "leader's replacements (supervisor.host.site.Site.replacements)"
    )


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        ("def f(hosts: int): ...", [1]),
        ("def f(*, hosts: int | None = None): ...", [1]),
        ("def f(hosts: 'int'): ...", [1]),
        ("def f(hosts: Optional[int]): ...", [1]),
        ("async def f(x, /, hosts: int): ...", [1]),
        ("class A:\n    hosts: int", [2]),
        ("class A:\n    def __init__(self):\n        self.hosts: int = 0", [3]),
        ("def f(host_count: int, hosts: tuple[int, ...]): ...", []),
        ("def f(hosts: list[int] | None): ...", []),
        ("def f(hosts): ...", []),
        ("class A:\n    hosts_per_slice: int\n    hosts: set[int]", []),
        ("HELP = 'hosts: int'  # hosts: int", []),
    ],
    ids=[
        "parameter",
        "keyword-optional",
        "string-annotation",
        "optional",
        "async-after-positional-only",
        "field",
        "attribute",
        "count-and-collection",
        "list-or-none",
        "unannotated",
        "other-fields",
        "string-and-comment",
    ],
)
def test_every_form_of_a_count_named_hosts_is_found(source, lines):
    assert host_counts_named_hosts(source) == lines


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        ("if local:\n    pass", [1]),
        ("x = a if plan.local else b", [1]),
        ("if not self._local and ready:\n    pass", [1]),
        ("while site.is_local:\n    pass", [1]),
        ("xs = [h for h in hosts if local]", [1]),
        ("match plan.local:\n    case True:\n        pass", [1]),
        ("f(local=True)\nx = plan.local", []),
        ("if spec.local.hosts is None:\n    pass", []),
        ("if locally:\n    pass", []),
        ("TEXT = 'if local:'  # if local:", []),
    ],
    ids=[
        "if",
        "ternary",
        "private-attribute",
        "while",
        "comprehension",
        "match",
        "passed-not-branched-on",
        "the-specs-local-section",
        "other-name",
        "string-and-comment",
    ],
)
def test_every_form_of_a_branch_on_a_local_run_is_found(source, lines):
    assert local_branches(source) == lines


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        ("if replacement_timeout is None:\n    pass", [1]),
        ("x = a if self.plan.replacement_timeout is not None else b", [1]),
        ("if None is timeout.replacement_timeout:\n    pass", [1]),
        ("if replacement_timeout:\n    pass", [1]),
        ("if replacement_timeout > 3:\n    pass", []),
        ("f(replacement_timeout=None)", []),
    ],
    ids=["is-none", "is-not-none", "none-first", "truthiness", "compared-to-a-number", "passed"],
)
def test_every_form_of_a_branch_on_a_missing_replacement_timeout_is_found(source, lines):
    assert replacement_timeout_none_branches(source) == lines
