"""No split brain: a leader paused long enough to be replaced, then resumed, is fenced and changes
nothing.

The supervisor process of host 0 (the job's first leader) is stopped with SIGSTOP once the job
trains; its workload runs on. Its lease expires, another host takes it over with the next term and
carries on; then host 0's supervisor is resumed (SIGCONT). Woken up, the old leader finds every
member's connection closed: unfenced, it would take each for a lost host and decide on it (into the
job's decision log, `policy-events.jsonl`), and write the job summary. Fenced (its last renewal is
older than the renew deadline), it does neither: it stands down, its own host rejoins the new
leader, and the report and the decision log are the new leader's alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.support.cli_runs import command_words, processes_mentioning, run_job
from tests.support.recovery_checks import problems

STEPS = 40  # run_job's default: the fault-free run's length
PAUSE_AT_STEP = 10


def supervisor_of_host_0(runs: Path) -> int | None:
    for pid in processes_mentioning(str(runs)):
        try:
            words = command_words(pid)
        except OSError:
            continue
        if "slicekeeper.supervisor" in words and words[-2:] == ["--host", "0"]:
            return pid
    return None


def steps_of_host_0(runs: Path) -> int:
    events = list(runs.glob("*/host-0/events.jsonl"))
    if not events:
        return 0
    return events[0].read_text().count('"step_end"')


def lease_term(runs: Path) -> int:
    leases = list(runs.glob("*/leader-lease.json"))
    return int(json.loads(leases[0].read_text())["transitions"]) + 1 if leases else 0


class Pauser(threading.Thread):
    """Pauses host 0's supervisor at PAUSE_AT_STEP until a new leader was elected and 2 s more."""

    def __init__(self, runs: Path) -> None:
        super().__init__(daemon=True)
        self.runs = runs
        self.paused_for: float | None = None
        self.error: str | None = None

    def run(self) -> None:
        deadline = time.monotonic() + 120
        while steps_of_host_0(self.runs) < PAUSE_AT_STEP:
            if time.monotonic() > deadline:
                self.error = "host 0 never reached the step"
                return
            time.sleep(0.05)
        pid = supervisor_of_host_0(self.runs)
        if pid is None:
            self.error = "no supervisor of host 0 found"
            return
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            while lease_term(self.runs) < 2 and time.monotonic() - stopped < 60:
                time.sleep(0.1)
            time.sleep(2.0)  # the new leader carries on meanwhile
        finally:
            os.kill(pid, signal.SIGCONT)
            self.paused_for = time.monotonic() - stopped


def leadership_story(run_dir: Path) -> str:
    """What every supervisor logged about leading and the Lease: said when an election was not the
    one expected (a fresh clone of 7009db8 saw term 3, not 2)."""
    lines = []
    for log in sorted(run_dir.glob("*/supervisor.log")):
        for line in log.read_text(errors="replace").splitlines():
            if re.search(r"lead|lease|term|standing down", line, re.IGNORECASE):
                lines.append(f"{log.parent.name}: {line}")
    return "\n".join(lines[-80:])


@pytest.fixture
def runs():
    """The run directory's parent, short: the SDK's Unix socket path lives under it (108 bytes max)."""
    folder = Path(tempfile.mkdtemp(prefix="sk-fence-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_paused_leader_is_replaced_and_once_resumed_changes_nothing(tmp_path, runs, clean_fingerprint):
    pauser = Pauser(runs)
    pauser.start()
    result, report = run_job(tmp_path, "--spares", "1", local={"workDir": str(runs)})
    pauser.join(timeout=5)
    assert pauser.error is None, pauser.error
    assert result.returncode == 0, result.stderr[-3000:]
    assert report is not None and pauser.paused_for is not None and pauser.paused_for > 3
    assert problems(report, fingerprint=clean_fingerprint, steps=STEPS) == []
    [change] = report["leader_changes"]  # written by the new leader, not overwritten by the old one
    assert (change["from_host"], change["term"]) == (0, 2), leadership_story(Path(report["run_dir"]))
    host_0 = (Path(report["run_dir"]) / "host-0" / "supervisor.log").read_text()
    assert "standing down as leader" in host_0
    # Every decision in the job's decision log is one the report knows: the old leader, woken up
    # among closed connections, decided nothing.
    logged = [json.loads(line) for line in Path(report["events_log"]).read_text().splitlines()]
    assert len(logged) == len(report["decisions"]), (logged, report["decisions"])
    assert processes_mentioning(report["run_dir"]) == []
