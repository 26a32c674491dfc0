"""Which tests `make test`'s two pytest-xdist workers may run side by side (`RunsApart`).

The runs of several processes (a local run's supervisors and workloads, the operator's pods, JAX over
gloo) keep the CPUs 40-95 % busy on the 2-core machine and share the session's fault-free runs
(tests/conftest.py `clean`, module fixtures): they are one scope, run one after another on one
worker, as a plain `pytest` runs them. The unit tests run in the test process (a leader over
loopback, fake members, pure functions): they fill the CPU the runs leave idle, on the other worker,
a module at a time so that a module's fixtures are made once.

The runs that leave the most CPU idle (tests/integration: 40-70 % busy, the rest waiting on
deadlines, hang timers and steps that sleep) go first, beside the unit tests; the ones that keep both
cores busy (the operator's JAX pods, the chaos runs: 80-96 %) after them, when the unit tests are done
(`run_order`). Measured beside the unit tests, the chaos runs first took twice their time.

A scheduler of its own (pytest-xdist's `pytest_xdist_make_scheduler`), not `--dist loadgroup`: the
groups of that one are written into each test's id, which pytest 9.2 no longer lets a plugin change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

RUNS_SCOPE = "runs"
"""The scope of every test that starts runs of several processes: one worker, one at a time."""
UNIT = "tests/unit"
RUNS_IN_UNIT = frozenset(
    {
        "test_reference_elastic.py",  # four JAX processes over gloo
        "test_silent_partitions.py",  # nftables tables and group ids, as the partition runs use
        "test_local_run_owns_its_processes.py",  # whole local runs
    }
)
"""Unit modules that start such runs, or use what the runs use machine-wide."""


def scope_of(nodeid: str) -> str:
    """The scope of a test by its id (`tests/unit/test_x.py::test_y[...]`): RUNS_SCOPE, or its unit
    module's path."""
    path = nodeid.split("::", 1)[0]
    folder, _, name = path.rpartition("/")
    if folder != UNIT or name in RUNS_IN_UNIT:
        return RUNS_SCOPE
    return path


RUN_ORDER = ("tests/integration/", "tests/e2e/", "tests/operator/", "tests/chaos/")
"""The order of the runs' folders (unit modules in RUNS_IN_UNIT with the first)."""


def run_order(nodeid: str) -> int:
    """Where a test goes in the suite's order: by its folder's place in RUN_ORDER."""
    return next((i for i, folder in enumerate(RUN_ORDER) if nodeid.startswith(folder)), 0)


def runs_apart(config: pytest.Config, log: object) -> object:
    """pytest-xdist's scope scheduler, its scopes `scope_of` (imported here: without pytest-xdist the
    suite runs in one process and needs none of this)."""
    from xdist.scheduler import LoadScopeScheduling

    class RunsApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return RunsApart(config, log)  # type: ignore[arg-type]
