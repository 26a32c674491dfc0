"""No module of the test suite imports a test module: what tests share lives in tests/support/.

pytest imports each test file on its own, as a top-level module (tests/unit/test_x.py is `test_x`:
tests/unit has no __init__.py), so a test file that another one imports as `tests.unit.test_x` is
loaded twice, as two modules with their own state, and any test function it hands over is collected
again in the importer. Every Python file under tests/ (test modules, conftest.py files, the support
modules, the fixtures' scripts) is read with `ast`: a test module named in a string or a comment does
not count, and every form of import does (absolute, relative, `from package import test_x`, and the
top-level name pytest gives a test file), wherever it is in the file.
"""

from __future__ import annotations

import ast

import pytest

from tests.support.cli_runs import ROOT

TESTS = ROOT / "tests"


def imported_modules(source: str, package: list[str]) -> list[str]:
    """Every module an import in `source` may load, as a dotted name; for `from M import n`, both M and
    M.n (n may be a module). Relative imports are resolved against `package` (e.g. tests, unit)."""
    modules = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            modules += [module, *(f"{module}.{alias.name}" for alias in node.names)]
    return modules


def imports_of_test_modules(source: str, package: list[str], tests: set[str]) -> list[str]:
    """The modules imported in `source` that are one of the test modules `tests` (names like
    `test_x`), whether named with their package or without it."""
    return [name for name in imported_modules(source, package) if name.split(".")[-1] in tests]


def test_no_module_of_the_suite_imports_a_test_module():
    tests = {path.stem for path in TESTS.rglob("test_*.py")}
    assert {"test_suite_layout", "test_leader_coordination", "test_operator_reconcile"} <= tests
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        package = list(path.relative_to(ROOT).parent.parts)
        if names := imports_of_test_modules(path.read_text(), package, tests):
            found[str(path.relative_to(ROOT))] = names
    assert not found, (
        f"test modules imported by other modules of the suite: {found}; move what they share into a "
        "module of tests/support/ and import it from there"
    )


@pytest.mark.parametrize(
    ("source", "package", "imports_a_test_module"),
    [
        ("from tests.unit.test_x import helper", ["tests", "unit"], True),
        ("import tests.unit.test_x", ["tests", "operator"], True),
        ("import tests.unit.test_x as x", ["tests", "operator"], True),
        ("from tests.unit import test_x", ["tests", "operator"], True),
        ("from .test_x import helper", ["tests", "unit"], True),
        ("from . import test_x", ["tests", "unit"], True),
        ("from ..unit.test_x import helper", ["tests", "operator"], True),
        ("import test_x", ["tests", "unit"], True),  # the name pytest gives tests/unit/test_x.py
        ("def f():\n    from tests.unit.test_x import helper", ["tests", "unit"], True),
        ("from tests.support.fake_members import Member, join", ["tests", "unit"], False),
        ("from tests.support import e2e_cluster as cluster", ["tests", "unit"], False),
        ("import unittest.mock", ["tests", "unit"], False),
        ("TEXT = 'from tests.unit.test_x import helper'  # import test_x", ["tests", "unit"], False),
    ],
    ids=[
        "from-module",
        "import",
        "import-as",
        "from-package",
        "relative-module",
        "relative-package",
        "relative-parent",
        "pytest-name",
        "nested",
        "support-module",
        "support-package",
        "other-module",
        "string-and-comment",
    ],
)
def test_every_form_of_import_of_a_test_module_is_found(source, package, imports_a_test_module):
    found = imports_of_test_modules(source, package, {"test_x", "test_y"})
    assert bool(found) is imports_a_test_module, found


def test_every_support_module_says_what_it_is_for():
    support = sorted((TESTS / "support").glob("*.py"))
    assert len(support) > 1
    undocumented = [path.name for path in support if not ast.get_docstring(ast.parse(path.read_text()))]
    assert not undocumented, f"tests/support modules without a module docstring: {undocumented}"
