"""Packaging: the import names map onto the folders, and `operator` stays the standard library.

The folders `operator/`, `supervisor/` and `workload/` are installed as `slicekeeper.operator`,
`slicekeeper.supervisor` and `slicekeeper.workload` (setuptools `package-dir`). The trap
(/work/shared/DESIGN.md, "Names"): the standard library has a module `operator`, imported by
`collections`, `enum` and so by nearly everything; were the folder importable as a top-level package,
`python -m ...` or `python -c ...` run from the repo root would pick it up instead and fail at once.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
STDLIB_OPERATOR = Path(sysconfig.get_path("stdlib")) / "operator.py"
MAPPED = {
    "slicekeeper.operator": "operator",
    "slicekeeper.supervisor": "supervisor",
    "slicekeeper.workload": "workload",
    "slicekeeper.workload.reference": "workload/reference",
}
"""Import name -> the folder it is installed from (pyproject.toml, [tool.setuptools.package-dir])."""
A_MODULE_OF = {
    "slicekeeper.operator": "render",
    "slicekeeper.supervisor": "plan",
    "slicekeeper.workload": "sdk",
    "slicekeeper.workload.reference": "jax_trainer",
}


def python(*args: str, cwd: Path) -> str:
    """Run this interpreter; its stdout (a failure shows its stderr)."""
    result = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    return result.stdout


# --- in the checkout ----------------------------------------------------------------------------


def test_operator_is_the_stdlib_module_even_from_the_repo_root():
    printed = python("-c", "import operator; print(operator.__file__)", cwd=ROOT)
    assert Path(printed.strip()) == STDLIB_OPERATOR


def test_python_dash_m_works_from_the_repo_root():
    # -m puts the current directory first on sys.path, where the folder `operator/` is.
    assert "usage: slicekeeper" in python("-m", "slicekeeper.cli", "--help", cwd=ROOT)


@pytest.mark.parametrize("name", MAPPED)
def test_each_import_name_resolves_to_its_folder_in_the_checkout(name):
    spec = importlib.util.find_spec(f"{name}.{A_MODULE_OF[name]}")
    assert spec is not None and spec.origin is not None
    assert Path(spec.origin).resolve() == ROOT / MAPPED[name] / f"{A_MODULE_OF[name]}.py"


def test_neither_slicekeeper_nor_the_operator_folder_has_an_init_module():
    # A regular slicekeeper/__init__.py hides the mapped subpackages from an editable install;
    # operator/__init__.py makes the folder shadow the standard library (module docstring).
    assert not (ROOT / "operator" / "__init__.py").exists()
    assert not (ROOT / "slicekeeper" / "__init__.py").exists()


def test_every_folder_of_modules_is_a_package_pyproject_names():
    # setuptools builds only the packages listed; a folder left out is missing from the wheel (and
    # from the strict editable install) without an error.
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages, folders = set(setuptools["packages"]), setuptools["package-dir"]
    unnamed = set()
    for top in ("slicekeeper", "operator", "supervisor", "workload"):
        for module in (ROOT / top).rglob("*.py"):
            folder = module.parent.relative_to(ROOT)
            if top == "slicekeeper":  # in place: no package-dir entry
                name, mapped_from = ".".join(folder.parts), None
            else:
                name, mapped_from = ".".join(("slicekeeper", *folder.parts)), folder.as_posix()
            if name not in packages or folders.get(name) != mapped_from:
                unnamed.add(f"{folder} as {name}")
    assert not unnamed, f"folders of modules not in [tool.setuptools] packages/package-dir: {sorted(unnamed)}"


def test_the_installed_cli_entry_point_runs():
    script = Path(sys.executable).parent / "slicekeeper"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage: slicekeeper" in result.stdout


# --- a wheel built from the sources -------------------------------------------------------------


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A wheel built from a copy of the sources (the checkout is left alone) and installed into a
    folder of its own: (the wheel, the folder)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")
    for folder in ("slicekeeper", "operator", "supervisor", "workload"):
        shutil.copytree(ROOT / folder, source / folder, ignore=ignore)
    for file in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / file, source / file)
    pip = ("-m", "pip", "--disable-pip-version-check", "--no-input", "-q")
    python(
        *pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"), str(source), cwd=work
    )
    [wheel] = (work / "dist").glob("slicekeeper-*.whl")
    python(*pip, "install", "--no-deps", "--no-index", "--target", str(work / "site"), str(wheel), cwd=work)
    return wheel, work / "site"


def test_the_wheel_holds_the_mapped_packages_under_slicekeeper_and_nothing_at_the_top(installed_wheel):
    wheel, _ = installed_wheel
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith((".dist-info", ".data"))} == {"slicekeeper"}
    for name, folder in MAPPED.items():
        package = name.replace(".", "/")
        assert f"{package}/{A_MODULE_OF[name]}.py" in names
        # Every module of the folder, not just the one looked at above.
        for module in (ROOT / folder).glob("*.py"):
            assert f"{package}/{module.name}" in names
    assert "slicekeeper/__init__.py" not in names and "slicekeeper/operator/__init__.py" not in names
    for package in ("slicekeeper", "slicekeeper/operator", "slicekeeper/supervisor", "slicekeeper/workload"):
        assert f"{package}/py.typed" in names


def test_the_wheel_declares_the_cli_entry_point(installed_wheel):
    wheel, _ = installed_wheel
    archive = zipfile.ZipFile(wheel)
    [entry_points] = [name for name in archive.namelist() if name.endswith(".dist-info/entry_points.txt")]
    assert "slicekeeper = slicekeeper.cli:main" in archive.read(entry_points).decode()


def test_the_installed_wheel_imports_from_its_own_folder_and_leaves_operator_to_the_stdlib(
    installed_wheel, tmp_path
):
    _, site = installed_wheel
    # -S: not even the virtualenv's site-packages (where the editable install points at the checkout).
    code = (
        "import sys, importlib.util, operator\n"
        f"sys.path.insert(0, {str(site)!r})\n"
        "print(operator.__file__)\n"
        f"for name in {sorted(f'{n}.{m}' for n, m in A_MODULE_OF.items())!r}:\n"
        "    print(importlib.util.find_spec(name).origin)\n"
    )
    lines = python("-S", "-c", code, cwd=tmp_path).splitlines()
    assert Path(lines[0]) == STDLIB_OPERATOR
    for origin in lines[1:]:
        assert Path(origin).is_relative_to(site), origin
    assert len(lines) == 1 + len(A_MODULE_OF)
