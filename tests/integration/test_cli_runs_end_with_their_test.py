"""A `slicekeeper run` started by a test never outlives it: not past its time limit, not past pytest.

The runs here never end by themselves (100,000 steps) and their workload starts a helper process of
its own, as real training commands do (a shell wrapper, data loader workers): when the CLI is killed,
its supervisors and their workloads die with it (PR_SET_PDEATHSIG), but such a helper is nobody's
direct child and lives on unless the test kills it. Each test first checks that the run was training
when it was cut short, so that "nothing left" is not the result of a run that never started.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli_runs import (
    KILL_MARGIN_SECONDS,
    ROOT,
    SDK_LOOP,
    cli_time_limit,
    kill_processes_mentioning,
    processes_mentioning,
    run_cli,
    sdk_loop_job,
)

ENDLESS = 100_000
HELPER_PROCESS = ["sh", "-c", 'sleep 300 & exec "$0" "$@"', sys.executable, str(SDK_LOOP)]
"""A workload that leaves a helper process running beside the SDK loop (the shell execs the loop)."""


@pytest.fixture
def where(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A short directory for a run (its SDK sockets' paths must fit in 107 bytes); whatever of the
    run a failed test left alive is killed afterwards."""
    where = tmp_path_factory.mktemp("run")
    yield where
    kill_processes_mentioning(str(where))


def endless_job(where: Path) -> Path:
    """A run whose run directory, checkpoints and processes all mention `where`."""
    return sdk_loop_job(
        where / "job.yaml",
        steps=ENDLESS,
        workload={"command": HELPER_PROCESS},
        local={"workDir": str(where / "runs")},
        checkpoint={"localDir": str(where / "checkpoints")},
    )


def trained(where: Path) -> bool:
    """Some host of the run under `where` completed a training step."""
    return any('"step_end"' in log.read_text() for log in where.glob("runs/*/host-*/events.jsonl"))


def gone_within(text: str, seconds: float) -> list[int]:
    """Processes mentioning `text` still alive after up to `seconds` (dying ones take a moment)."""
    deadline = time.monotonic() + seconds
    while (alive := processes_mentioning(text)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


# --- the run's own time limit ---------------------------------------------------------------------


def test_a_run_cut_short_by_its_time_limit_is_killed_whole_before_run_cli_returns(where):
    job = endless_job(where)
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        # 3 s from its first step: a fixed 12 s from its start once ran out before any step, with
        # two other test files' runs beside it.
        run_cli("run", str(job), timeout=3, from_when=lambda: trained(where))
    assert trained(where), "the run should have been training when its time was up"
    assert processes_mentioning(str(where)) == []  # at once: run_cli waited for every process
    assert "run directory:" in str(timed_out.value.output)  # what the CLI printed before it was killed


@pytest.mark.timeout(60)
def test_a_run_gets_what_is_left_of_the_test_timeout_less_a_margin():
    left = cli_time_limit()
    assert left is not None
    assert 60 - KILL_MARGIN_SECONDS - 5 < left <= 60 - KILL_MARGIN_SECONDS
    assert cli_time_limit(900) <= left  # asking for more than the test has gives no more
    assert cli_time_limit(5) == 5


# --- pytest-timeout firing while a run goes on -------------------------------------------------------

INNER_TEST = """
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.support.cli_runs import run_cli, sdk_loop_job

WHERE = Path({where!r})
METHOD = {method!r}


def fire_the_timeout_once_training():
    \"\"\"pytest-timeout's own timeout, brought forward to a second after the run's first step: the
    test is cut short while its run trains, however long the run took to start on this machine.\"\"\"
    while not any('"step_end"' in log.read_text() for log in WHERE.glob("runs/*/host-*/events.jsonl")):
        time.sleep(0.2)
    time.sleep(1.0)
    if METHOD == "signal":
        signal.setitimer(signal.ITIMER_REAL, 0.01)  # its SIGALRM handler fires now
    else:
        [timer] = [t for t in threading.enumerate() if t.name.startswith("pytest_timeout ")]
        timer.cancel()
        threading.Timer(0.01, timer.function, timer.args, timer.kwargs).start()


@pytest.mark.timeout({limit}, method=METHOD)
def test_a_run_longer_than_the_test():
    job = sdk_loop_job(
        WHERE / "job.yaml",
        steps=100_000,
        workload={{"command": {command!r}}},
        local={{"workDir": str(WHERE / "runs")}},
        checkpoint={{"localDir": str(WHERE / "checkpoints")}},
    )
    threading.Thread(target=fire_the_timeout_once_training, daemon=True).start()
    run_cli("run", str(job), timeout=900)
"""
INNER_LIMIT = 90
"""The inner test's timeout if its run never trains (then `trained` below fails the outer test)."""


@pytest.mark.parametrize(
    ("method", "command"),
    [
        # `signal` (pyproject.toml) raises in the test: run_cli kills the run, helpers included.
        ("signal", HELPER_PROCESS),
        # `thread` ends pytest with os._exit: only PDEATHSIG is left, which reaches the CLI, the
        # supervisors and their workloads, but no helper a workload started.
        ("thread", [sys.executable, str(SDK_LOOP)]),
    ],
    ids=["signal", "thread"],
)
def test_a_test_timed_out_by_pytest_leaves_no_process_of_its_run_behind(tmp_path, where, method, command):
    (tmp_path / "test_inner.py").write_text(
        textwrap.dedent(INNER_TEST).format(
            where=str(where), method=method, command=command, limit=INNER_LIMIT
        )
    )
    # The inner session loads no conftest.py: run_cli knows nothing of its test's timeout, as in a
    # run that pytest-timeout interrupts.
    inner = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)),
            *("-c", str(ROOT / "pyproject.toml"), "--basetemp", str(tmp_path / "inner-tmp")),
            str(tmp_path / "test_inner.py"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=INNER_LIMIT + 60,
    )
    assert inner.returncode != 0 and "Timeout" in inner.stdout + inner.stderr, inner.stdout + inner.stderr
    assert trained(where), "the run should have been training when pytest-timeout fired"
    assert gone_within(str(where), 10) == []
