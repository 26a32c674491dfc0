"""A hang is named after the host that stopped, whichever supervisor noticed it first.

The job is a loop in lockstep (tests/fixtures/lockstep_loop.py): when one host stops, the other three
stop with it, waiting at the step's barrier, and every supervisor's hang timer runs. Each host index
is hung in turn, two a run (one a generation); each detection, the policy's events, the report and
the culprits' fault counters must name the host that stopped, whichever supervisor's timer fired
first.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.cli_runs import ROOT, read_report, run_job

LOCKSTEP = ROOT / "tests" / "fixtures" / "lockstep_loop.py"
STEPS = 32
HUNG_AT = (10, 22)
"""Each run hangs two hosts, one a generation: the second after the first's restart (restored from
step 8, checkpoints every 4 steps), so each detection is judged on its own."""


def lockstep_run(tmp_path, chaos: str, *args: str):
    return run_job(
        tmp_path,
        "--chaos",
        chaos,
        steps=STEPS,
        workload={"command": [sys.executable, str(LOCKSTEP), *args]},
        checkpoint={"interval": 4, "persistent": None},
    )


def hangs(hung: tuple[int, int], where: str = "") -> str:
    """The chaos of a run hanging host hung[i] at step HUNG_AT[i] (`where`: `,at=collective`)."""
    return ",".join(f"hang:host={host}{where}@step={step}" for host, step in zip(hung, HUNG_AT, strict=True))


@pytest.mark.parametrize("hung", [(0, 1), (2, 3)], ids=["hosts-0-then-1", "hosts-2-then-3"])
def test_a_hang_is_named_after_the_host_that_stopped(tmp_path, hung):
    result, report = lockstep_run(tmp_path, hangs(hung))
    assert result.returncode == 0, result.stderr[-3000:]
    assert report is not None and report["restarts"] == {"hang": 2}
    detections = report["detections"]
    assert [(d["kind"], d["host"]) for d in detections] == [("hang", host) for host in hung], detections
    for detection, host, step in zip(detections, hung, HUNG_AT, strict=True):
        assert f"host {host} is in its own work of step {step}" in detection["detail"]
    assert [(d["event"]["kind"], d["event"]["host"]) for d in report["decisions"]] == [
        ("hang", host) for host in hung
    ]
    for host in hung:
        assert f"hang detected on host {host}:" in result.stdout + result.stderr
    # Each supervisor counts the faults attributed to its host (slicekeeper_host_faults_total).
    machines = {h: read_report(Path(report["run_dir"]) / f"host-{h}" / "report.json") for h in range(4)}
    assert {h: m["faults"] for h, m in machines.items()} == {
        h: {"hang": 1} if h in hung else {} for h in range(4)
    }
    # Every member holds the leader's last journal, written down before the final shutdown.
    assert len({m["journal_seq"] for m in machines.values()}) == 1 and machines[0]["journal_seq"] > 0


def test_a_host_stopped_inside_the_collective_is_named_by_its_stopped_process(tmp_path):
    """Stopped once its own work of the step is done: every host then waits in the step's collective
    (the same stage), and only the stopped process tells the culprit from the others."""
    hung = (0, 2)
    result, report = lockstep_run(tmp_path, hangs(hung, ",at=collective"), "--collective-seconds", "0.2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert report is not None and report["restarts"] == {"hang": 2}
    detections = report["detections"]
    assert [(d["kind"], d["host"]) for d in detections] == [("hang", host) for host in hung], detections
    for detection, host, step in zip(detections, hung, HUNG_AT, strict=True):
        inside = f"host {host} is waiting for the other hosts in step {step}"
        assert inside in detection["detail"] and "its workload process stopped" in detection["detail"]
