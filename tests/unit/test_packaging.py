"""Packaging: the import names map onto the folders, and `operator` stays the standard library."""

import importlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_stdlib_operator_and_slicekeeper_operator_coexist():
    import operator

    assert operator.add(2, 3) == 5
    assert Path(operator.__file__).parent != ROOT / "operator"
    importlib.import_module("slicekeeper.operator")
    importlib.import_module("slicekeeper.supervisor")
    importlib.import_module("slicekeeper.workload")


def test_operator_is_the_stdlib_even_from_the_repo_root():
    code = "import operator, json; print(operator.__file__); operator.itemgetter(0)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "site-packages" not in result.stdout or "operator" in result.stdout
    assert not result.stdout.strip().startswith(str(ROOT / "operator"))


def test_the_operator_folder_is_not_a_top_level_package():
    assert not (ROOT / "operator" / "__init__.py").exists()
    assert not (ROOT / "slicekeeper" / "__init__.py").exists()


def test_the_cli_entry_point_is_installed():
    assert (Path(sys.executable).parent / "slicekeeper").exists()
