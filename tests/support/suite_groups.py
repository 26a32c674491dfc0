"""Which tests `make test`'s two pytest-xdist workers (`--dist loadgroup`) may run side by side.

The runs of several processes (a local run's supervisors and workloads, the operator's pods, JAX over
gloo) keep the CPUs 40-95 % busy on the 2-core machine and share the session's fault-free runs
(tests/conftest.py `clean`, module fixtures): they are one group, run one after another on one
worker, as a plain `pytest` runs them. The unit tests run in the test process (a leader over
loopback, fake members, pure functions): they fill the CPU the runs leave idle, on the other worker,
one module at a time so that a module's fixtures are made once.
"""

from __future__ import annotations

from pathlib import Path

RUNS_GROUP = "runs"
"""The xdist group of every test that starts runs of several processes: one worker, one at a time."""
UNIT = Path(__file__).parent.parent / "unit"
RUNS_IN_UNIT = frozenset(
    {
        "test_reference_elastic.py",  # four JAX processes over gloo
        "test_silent_partitions.py",  # nftables tables and group ids, as the partition runs use
        "test_local_run_owns_its_processes.py",  # whole local runs
    }
)
"""Unit modules that start such runs, or use what the runs use machine-wide."""


def xdist_group(path: Path) -> str:
    """The xdist group of the tests in `path`: RUNS_GROUP, or the unit module's own."""
    if path.parent != UNIT or path.name in RUNS_IN_UNIT:
        return RUNS_GROUP
    return f"unit/{path.name}"
