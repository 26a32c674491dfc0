"""Programs that stand in for a machine's supervisor in tests of the local runtime: forked by the
run's fork server (supervisor/local/fork_server.py) like a supervisor, they run a few lines of Python."""

from __future__ import annotations

import sys

STAND_IN = "tests.support.stand_ins:run_program"
"""The fork server's entry point for a stand-in (its one argument: the program's source)."""


def run_program(args: list[str]) -> int:
    """Run `args[0]` as `python -c` would; its exit code."""
    try:
        exec(compile(args[0], "<stand-in>", "exec"), {"__name__": "__main__"})
    except SystemExit as exit:
        return exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    finally:
        sys.stdout.flush()
    return 0
