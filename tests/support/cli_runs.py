"""Helpers for tests that run `slicekeeper` as users do: a subprocess (its output a pipe, or a
pseudo-terminal as at a user's terminal), files, exit codes.

A CLI run never outlives its test. `run_cli` and `started_cli` start the CLI in a session of its
own, marked with an environment variable (`RUN_MARK`) that every process it starts inherits (its
supervisors, their workloads, anything those start), and tied to the test process with
PR_SET_PDEATHSIG. Whatever ends the wait early (the run's time limit, pytest-timeout, Ctrl-C, a
failed assertion inside `started_cli`) kills every marked process and waits until none is left
before the exception goes on; reparented processes are found by the mark, whose process groups die
with them. If pytest itself dies (pytest-timeout's `thread` method calls os._exit, or the process is
killed), the CLI dies with it and its supervisors and workloads follow by their own PDEATHSIG.

Time limits: the test's pytest timeout (pyproject.toml, or a module's `pytest.mark.timeout`) is the
one budget. A CLI run gets what is left of it less KILL_MARGIN_SECONDS (time to kill the processes,
wait for them and report), or the `timeout` it asks for if that is shorter: a slow module raises its
own `pytest.mark.timeout` instead of passing a longer `timeout` to `run_cli`. conftest.py learns each
test's budget from pytest-timeout's hooks (`start_test_clock`, `stop_test_clock`); pytest-timeout
must use its `signal` method (pyproject.toml), which raises in the test so that the kill above runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import termios
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "trainingjob.yaml"
SDK_LOOP = ROOT / "examples" / "sdk_loop.py"

RUN_MARK = "SLICEKEEPER_TEST_RUN"
"""Environment variable carrying one CLI run's mark, inherited by every process of the run."""

RUN_JOB_STEPS = 40
"""`run_job`'s default length: the length of the runs compared with the computed fault-free
fingerprint (tests/integration/conftest.py)."""

KILL_MARGIN_SECONDS = 10.0
"""What a CLI run leaves of its test's pytest timeout: time to kill its processes and report."""

KILL_WAIT_SECONDS = 10.0
"""How long killed processes may take to be gone (one in uninterruptible sleep dies when it wakes)."""

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)  # resolved here: a forked child must not load libraries

_test_deadline: float | None = None
"""time.monotonic() at which pytest-timeout fires for the running test; None: no timeout."""

_marks: list[str] = []
"""Marks of the CLI runs started since conftest last checked for leftovers."""


def write_job(path: Path, **spec_changes: Any) -> Path:
    """The example TrainingJob with changes to `spec` (nested dicts are merged one level deep)."""
    document = yaml.safe_load(EXAMPLE.read_text())
    for key, value in spec_changes.items():
        if isinstance(value, dict) and isinstance(document["spec"].get(key), dict):
            document["spec"][key].update(value)
        else:
            document["spec"][key] = value
    path.write_text(yaml.safe_dump(document))
    return path


def sdk_loop_job(path: Path, steps: int = 40, **spec_changes: Any) -> Path:
    """A fast job: the numpy SDK example loop (50 ms steps) instead of the JAX trainer."""
    changes: dict[str, Any] = {
        "workload": {
            "command": [sys.executable, str(SDK_LOOP)],
            "args": [],
            "steps": steps,
            "standby": False,
        },
        # No spares and no persistent tier unless a test asks: nothing written outside tmp dirs.
        "checkpoint": {"interval": 5, "persistent": None},
        "local": {"spares": 0},
    }
    for key, value in spec_changes.items():
        if isinstance(value, dict) and isinstance(changes.get(key), dict):
            changes[key] = {**changes[key], **value}
        else:
            changes[key] = value
    return write_job(path, **changes)


def sdk_loop_fingerprint(steps: int) -> str:
    """The parameters fingerprint `examples/sdk_loop.py` ends with after `steps` steps, computed here
    (its data is a function of the step): what a run must report, with or without faults."""
    params = np.zeros(64)
    for step in range(1, steps + 1):
        params = 0.9 * params + 0.1 * np.random.default_rng([0, step]).normal(size=64)
    return hashlib.sha256(params.tobytes()).hexdigest()


@dataclass(frozen=True)
class DocumentedMetric:
    kind: str
    """counter, gauge or histogram"""
    labels: frozenset[str]


def documented_metrics(doc: str = "supervisor.md") -> dict[str, DocumentedMetric]:
    """The metrics the table of docs/`doc` lists (the supervisor's by default), by exposed name."""
    return metrics_table((ROOT / "docs" / doc).read_text())


def metrics_table(text: str) -> dict[str, DocumentedMetric]:
    """The metrics a document's table lists, by exposed name. Two shapes of row: `| names | types |
    meaning |`, labels in braces after each name, one type for all or one per name (docs/supervisor.md);
    and `| name | type | labels | meaning |`, each label in backquotes (docs/operator.md)."""
    metrics = {}
    for row in text.splitlines():
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        if not row.startswith("| `slicekeeper_") or len(cells) not in (3, 4):
            continue
        names = re.findall(r"`([a-z_]+)(?:\{([a-z_,]+)\})?`", cells[0])
        kinds = [kind.strip() for kind in cells[1].split(",")]
        kinds = kinds * len(names) if len(kinds) == 1 else kinds
        for (name, labels), kind in zip(names, kinds, strict=True):
            listed = re.findall(r"`([a-z_]+)`", cells[2]) if len(cells) == 4 else labels.split(",")
            metrics[name] = DocumentedMetric(kind, frozenset(filter(None, listed)))
    return metrics


# --- the test's time budget (set by conftest.py from pytest-timeout's hooks) ----------------------


def start_test_clock(timeout: float) -> None:
    """pytest-timeout fires `timeout` seconds from now for the test starting."""
    global _test_deadline
    _test_deadline = time.monotonic() + timeout


def stop_test_clock() -> None:
    global _test_deadline
    _test_deadline = None


def cli_time_limit(requested: float | None = None) -> float | None:
    """Seconds a CLI run started now may take: what is left of the test's pytest timeout less
    KILL_MARGIN_SECONDS, or `requested` if shorter; None when neither limits it."""
    limits = [] if requested is None else [requested]
    if _test_deadline is not None:
        limits.append(max(_test_deadline - time.monotonic() - KILL_MARGIN_SECONDS, 1.0))
    return min(limits) if limits else None


# --- running the CLI ----------------------------------------------------------------------------


def _dies_with(parent: int) -> Callable[[], None]:
    """preexec_fn: SIGKILL the child when `parent` (this thread) ends, however it ends."""

    def preexec() -> None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def _start_cli(args: tuple[str, ...]) -> tuple[subprocess.Popen[str], str]:
    mark = uuid.uuid4().hex
    _marks.append(mark)
    # PDEATHSIG follows the thread that forks: only the main thread lives as long as the test process.
    on_main_thread = threading.current_thread() is threading.main_thread()
    process = subprocess.Popen(
        [sys.executable, "-m", "slicekeeper.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, RUN_MARK: mark},
        start_new_session=True,
        preexec_fn=_dies_with(os.getpid()) if on_main_thread else None,
    )
    return process, mark


def processes_of_run(mark: str) -> list[int]:
    """Live processes of the CLI run with this mark (the CLI, supervisors, workloads, their children)."""
    return processes_mentioning(f"{RUN_MARK}={mark}")


def kill_run(mark: str) -> None:
    """SIGKILL every process of the run, with the process group each leads, and wait until none is left."""
    kill_processes_mentioning(f"{RUN_MARK}={mark}")


def kill_processes_mentioning(text: str) -> None:
    """SIGKILL every process `processes_mentioning(text)` finds, with the process group each leads,
    and wait until none is left."""
    deadline = time.monotonic() + KILL_WAIT_SECONDS
    while pids := processes_mentioning(text):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) == pid:  # a session or group leader: its group may hold unmarked ones
                    os.killpg(pid, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes mentioning {text!r} outlived SIGKILL: {pids}")
        time.sleep(0.02)


def _stop(process: subprocess.Popen[str], mark: str) -> tuple[str, str]:
    """Kill the run and collect what the CLI wrote before it died."""
    kill_run(mark)
    try:
        out, err = process.communicate(timeout=KILL_WAIT_SECONDS)
    except subprocess.TimeoutExpired:  # a pipe still held open: give up on the output
        process.kill()
        process.wait()
        out, err = "", ""
    return out or "", err or ""


def run_cli(
    *args: str, timeout: float | None = None, from_when: Callable[[], bool] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m slicekeeper.cli ARGS` from the repo root, output captured, within `cli_time_limit`.

    On its time limit it raises subprocess.TimeoutExpired; on that or on any interruption (pytest-timeout,
    Ctrl-C) every process of the run is killed and gone before the exception propagates.
    `from_when`: the time limit counts from when it first holds (looked at every 0.2 s, the output
    read meanwhile), not from the start: a test that must find its run in a given state when the
    limit is up, however long the run takes to get there on a loaded machine.
    """
    limit = cli_time_limit(timeout)
    process, mark = _start_cli(args)
    try:
        out, err = _communicate(process, limit, from_when)
    except subprocess.TimeoutExpired as expired:
        out, err = _stop(process, mark)
        assert limit is not None
        error = subprocess.TimeoutExpired(process.args, limit, output=out, stderr=err)
        why = (
            "as asked"
            if timeout is not None and timeout <= limit
            else f"what was left of the test's pytest timeout less {KILL_MARGIN_SECONDS:.0f} s"
        )
        error.add_note(
            f"run_cli: the CLI got {limit:.0f} s ({why}); it and every process it started were killed.\n"
            f"--- stdout (end) ---\n{out[-3000:]}\n--- stderr (end) ---\n{err[-3000:]}"
        )
        raise error from expired
    except BaseException:
        _stop(process, mark)
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def _communicate(
    process: subprocess.Popen[str], limit: float | None, from_when: Callable[[], bool] | None
) -> tuple[str, str]:
    """The process's whole output once it ended, within `limit` seconds of when `from_when` first
    held (of now, without it): subprocess.TimeoutExpired otherwise. A timed-out communicate loses no
    output and may be called again."""
    while from_when is not None and not from_when():
        with contextlib.suppress(subprocess.TimeoutExpired):
            return process.communicate(timeout=0.2)
    return process.communicate(timeout=limit)


@contextlib.contextmanager
def started_cli(*args: str) -> Iterator[subprocess.Popen[str]]:
    """The CLI running in the background, for a test that talks to it while it runs.

    Leaving the block while the CLI still runs (an assertion failed, the test timed out, or the test is
    simply done with it) kills every process of the run. A run that ended by itself is left alone: what
    it left behind is for the test to see, and conftest.py fails a test whose run left processes.
    """
    process, mark = _start_cli(args)
    try:
        yield process
    finally:
        if process.poll() is None:
            _stop(process, mark)
        else:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.communicate(timeout=KILL_WAIT_SECONDS)  # close the pipes


def leftover_processes(grace: float = 5.0) -> dict[str, list[int]]:
    """Processes of the CLI runs started since the last call that are still alive after `grace`
    seconds (processes dying with their parent take a moment), by run mark; they are killed."""
    deadline = time.monotonic() + grace
    left = {mark: processes_of_run(mark) for mark in _marks}
    while any(left.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
        left = {mark: processes_of_run(mark) for mark in _marks}
    leaks = {mark: pids for mark, pids in left.items() if pids}
    for mark in leaks:
        kill_run(mark)
    _marks.clear()
    return leaks


CTRL_C = b"\x03"


@dataclass(frozen=True)
class TerminalRun:
    returncode: int
    screen: str
    """Everything the CLI wrote to its terminal (stdout and stderr), escape sequences included; the
    terminal's line ends (\r\n) are turned back into \n."""


def run_cli_in_terminal(
    *args: str,
    columns: int = 120,
    rows: int = 50,
    ctrl_c_after: str | None = None,
    timeout: float | None = None,
) -> TerminalRun:
    """`python -m slicekeeper.cli ARGS` at a terminal, as a user runs it: a pseudo-terminal of
    `columns` x `rows` is its controlling terminal, stdin, stdout and stderr (TERM=xterm-256color).

    `ctrl_c_after`: once the CLI has written this text, Ctrl-C is typed on the terminal, which sends
    SIGINT to the CLI's process group (not to the supervisors: they run in sessions of their own).
    Time limits and the kill on any interruption are run_cli's.
    """
    limit = cli_time_limit(timeout)
    mark = uuid.uuid4().hex
    _marks.append(mark)
    dies_with = _dies_with(os.getpid()) if threading.current_thread() is threading.main_thread() else None

    def preexec() -> None:
        if dies_with is not None:
            dies_with()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # a session leader takes its stdin as controlling terminal

    controller, terminal = os.openpty()
    termios.tcsetwinsize(terminal, (rows, columns))
    env = {name: value for name, value in os.environ.items() if name not in ("COLUMNS", "LINES")}
    process = subprocess.Popen(
        [sys.executable, "-m", "slicekeeper.cli", *args],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        cwd=ROOT,
        env={**env, RUN_MARK: mark, "TERM": "xterm-256color"},
        start_new_session=True,
        preexec_fn=preexec,
    )
    os.close(terminal)
    written = bytearray()
    typed = ctrl_c_after is None
    deadline = None if limit is None else time.monotonic() + limit
    try:
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(process.args, limit or 0.0, output=bytes(written))
            if not select.select([controller], [], [], 0.5)[0]:
                continue
            try:
                chunk = os.read(controller, 1 << 16)
            except OSError:  # EIO: no process holds the terminal open any more
                chunk = b""
            if not chunk:
                break
            written += chunk
            if not typed and ctrl_c_after is not None and ctrl_c_after.encode() in written:
                os.write(controller, CTRL_C)
                typed = True
        returncode = process.wait(timeout=KILL_WAIT_SECONDS)
    except BaseException as error:
        kill_run(mark)
        process.wait()
        error.add_note(f"--- the terminal (end) ---\n{bytes(written[-3000:]).decode(errors='replace')}")
        raise
    finally:
        os.close(controller)
    return TerminalRun(returncode, written.decode(errors="replace").replace("\r\n", "\n"))


def run_job(
    tmp_path: Path, *extra: str, steps: int = RUN_JOB_STEPS, **spec: Any
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    """`slicekeeper run` of the SDK example loop job in `tmp_path`: the result and the report, if any."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    job = sdk_loop_job(tmp_path / "job.yaml", steps=steps, **spec)
    report_path = tmp_path / "report.json"
    result = run_cli("run", str(job), "--report", str(report_path), *extra)
    return result, read_report(report_path) if report_path.exists() else None


def read_report(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line or environment mentions `text` (e.g. a run directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            blob = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if text.encode() in blob and state != "Z":
            found.append(int(entry.name))
    return found


def command_words(pid: int | str) -> list[str]:
    """The words of process `pid`'s command line: its arguments, or the title a forked supervisor
    set (supervisor/local/fork_server.py: one string, its words separated by spaces)."""
    return (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")).split()


def supervisor_of(run_dir: str, machine: str) -> int:
    """The pid of the first supervisor (not a restart) a local run started on `machine` (`host-1`,
    `spare-0`)."""
    role, index = machine.rsplit("-", 1)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            words = command_words(entry.name)
            if words[:3] != ["python", "-m", "slicekeeper.supervisor"] or "--restart" in words:
                continue
            flag = f"--{role}"
            if flag in words and any(run_dir in w for w in words) and words[words.index(flag) + 1] == index:
                return int(entry.name)
    raise LookupError(f"no supervisor runs on {machine} for {run_dir}")
