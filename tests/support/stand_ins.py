"""Programs that stand in for a machine's supervisor in tests of the local runtime: forked by the
run's fork server (supervisor/local/fork_server.py) like a supervisor, they run a few lines of Python."""

from __future__ import annotations

STAND_IN = "tests.support.stand_ins:run_program"
"""The fork server's entry point for a stand-in (its one argument: the program's source)."""


def run_program(args: list[str]) -> int:
    """Run `args[0]` as `python -c` would (a `SystemExit` is read by the fork server as the
    interpreter reads it); 0 once it returns."""
    exec(compile(args[0], "<stand-in>", "exec"), {"__name__": "__main__"})
    return 0
