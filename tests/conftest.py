"""Shared test options: real-cluster tests are opt-in (`--with-e2e` and a KUBECONFIG).

Every run directory and temporary file of the session, ours and the subprocesses', goes under
pytest's own temporary tree (TMPDIR), which pytest prunes to the last few sessions: `slicekeeper run`
keeps its run directory for the user to read, and hundreds of test runs must not pile up in /tmp.

Each test's pytest timeout is handed to tests.support.cli_runs, which fits every CLI run inside it,
and a test whose CLI runs left processes alive fails (they are killed): see tests/support/cli_runs.py.
The suite's JAX programs compile at XLA's cheapest optimization: tests/support/xla_flags.py.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import alone, cli_runs, file_order, timeline, xla_flags
from tests.support.example_runs import clean_run
from tests.support.shared_runs import once_per_run


def pytest_configure(config: pytest.Config) -> None:
    # Before any test starts JAX or a job: every compile at XLA's cheapest (tests/support/xla_flags.py).
    xla_flags.use_cheap_compile()


@pytest.fixture(autouse=True, scope="session")
def _session_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    scratch = tmp_path_factory.mktemp("tmp", numbered=False)
    saved_env, saved_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = str(scratch)
    tempfile.tempdir = str(scratch)
    yield
    tempfile.tempdir = saved_dir
    if saved_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved_env


@pytest.fixture(autouse=True)
def _cli_runs_end_with_their_test() -> Iterator[None]:
    yield
    leaks = cli_runs.leftover_processes()
    if leaks:
        pytest.fail(f"CLI runs of this test left processes alive (now killed): {leaks}", pytrace=False)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Each test, its fixtures' set-up and tear-down included, in its turn: alone on the machine when
    marked `alone` (with the alone tests right after it: one wait for the machine to empty), beside
    at most one other `heavy` test when marked `heavy` (tests/support/alone.py).
    The outermost wrapper: the wait for a turn is not part of the test's timeout. Inside the turn,
    what the test costs goes to the timeline when asked for (tests/support/timeline.py)."""
    heavy = item.get_closest_marker(alone.HEAVY) is not None
    is_alone = item.get_closest_marker(alone.MARK) is not None
    next_is_alone = nextitem is not None and nextitem.get_closest_marker(alone.MARK) is not None
    with alone.heavy_slot(heavy), _TURNS.test(is_alone, next_is_alone), timeline.record(item.nodeid):
        return (yield)


_TURNS = alone.Turns()
"""This process's turns: consecutive `alone` tests share one (tests/support/alone.py)."""


def pytest_sessionfinish(session: pytest.Session) -> None:
    _TURNS.end()


@pytest.hookimpl(optionalhook=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> None:
    # Returns None, so pytest-timeout's own implementation still sets the timer.
    cli_runs.start_test_clock(float(settings.timeout))


@pytest.hookimpl(optionalhook=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> None:
    cli_runs.stop_test_clock()


@pytest.fixture(scope="session")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The fault-free run of the example job that the chaos and cluster tests compare with, run once
    per test run whatever the number of workers (tests/support/example_runs.py,
    tests/support/shared_runs.py); it counts towards the first test that needs it."""
    return once_per_run(tmp_path_factory, "clean", clean_run)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--with-e2e", action="store_true", default=False, help="run tests against a real cluster"
    )
    parser.addoption("--skip-slow", action="store_true", default=False, help="skip the slow chaos runs")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    with_e2e = config.getoption("--with-e2e") and os.environ.get("KUBECONFIG")
    for item in items:
        if "e2e" in item.keywords and not with_e2e:
            item.add_marker(pytest.mark.skip(reason="needs --with-e2e and KUBECONFIG"))
        if "slow" in item.keywords and config.getoption("--skip-slow"):
            item.add_marker(pytest.mark.skip(reason="--skip-slow"))
    # The order the workers get the files in (`make test`'s --no-loadscope-reorder keeps it).
    items[:] = file_order.in_file_order(items)
