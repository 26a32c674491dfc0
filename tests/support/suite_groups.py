"""Which tests `make test`'s two pytest-xdist workers may run side by side (`RunsApart`).

The runs of several processes (a local run's supervisors and workloads, the operator's pods, JAX over
gloo) keep the CPUs 40-95 % busy on the 2-core machine and share the session's fault-free runs
(tests/conftest.py `clean`, module fixtures): they are one scope, run one after another on one
worker, as a plain `pytest` runs them. The unit tests run in the test process (a leader over
loopback, fake members, pure functions): they fill the CPU the runs leave idle, on the other worker,
a module at a time so that a module's fixtures are made once.

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


def runs_apart(config: pytest.Config, log: object) -> object:
    """pytest-xdist's scope scheduler, its scopes `scope_of` (imported here: without pytest-xdist the
    suite runs in one process and needs none of this)."""
    from xdist.scheduler import LoadScopeScheduling

    class RunsApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return RunsApart(config, log)  # type: ignore[arg-type]
