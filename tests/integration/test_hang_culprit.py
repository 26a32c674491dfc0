"""A hang is named after the host that stopped, whichever supervisor noticed it first.

The job is a loop in lockstep (tests/fixtures/lockstep_loop.py): when one host stops, the other three
stop with it, waiting at the step's barrier, and every supervisor's hang timer runs. Each host index
is hung in turn; the detection, the policy's event, the report and the culprit's fault counter must
all name that host, whichever supervisor's timer fired first.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.cli_runs import ROOT, read_report, run_job

LOCKSTEP = ROOT / "tests" / "fixtures" / "lockstep_loop.py"
STEPS, HUNG_AT = 24, 12


def lockstep_run(tmp_path, chaos: str, *args: str):
    return run_job(
        tmp_path,
        "--chaos",
        chaos,
        steps=STEPS,
        workload={"command": [sys.executable, str(LOCKSTEP), *args]},
        checkpoint={"interval": 4, "persistent": None},
    )


@pytest.mark.parametrize("hung", [0, 1, 2, 3])
def test_a_hang_is_named_after_the_host_that_stopped(tmp_path, hung):
    result, report = lockstep_run(tmp_path, f"hang:host={hung}@step={HUNG_AT}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert report is not None and report["restarts"] == {"hang": 1}
    [detection] = report["detections"]
    assert (detection["kind"], detection["host"]) == ("hang", hung), detection
    assert f"host {hung} is in its own work of step {HUNG_AT}" in detection["detail"]
    [decision] = report["decisions"]
    assert decision["event"]["kind"] == "hang" and decision["event"]["host"] == hung
    assert f"hang detected on host {hung}:" in result.stdout + result.stderr
    # Each supervisor counts the faults attributed to its host (slicekeeper_host_faults_total).
    machines = {h: read_report(Path(report["run_dir"]) / f"host-{h}" / "report.json") for h in range(4)}
    assert {h: m["faults"] for h, m in machines.items()} == {
        h: {"hang": 1} if h == hung else {} for h in range(4)
    }
    # Every member holds the leader's last journal, written down before the final shutdown.
    assert len({m["journal_seq"] for m in machines.values()}) == 1 and machines[0]["journal_seq"] > 0


@pytest.mark.parametrize("hung", [0, 2])
def test_a_host_stopped_inside_the_collective_is_named_by_its_stopped_process(tmp_path, hung):
    """Stopped once its own work of the step is done: every host then waits in the step's collective
    (the same stage), and only the stopped process tells the culprit from the others."""
    result, report = lockstep_run(
        tmp_path, f"hang:host={hung},at=collective@step={HUNG_AT}", "--collective-seconds", "0.2"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert report is not None and report["restarts"] == {"hang": 1}
    [detection] = report["detections"]
    assert (detection["kind"], detection["host"]) == ("hang", hung), detection
    inside = f"host {hung} is waiting for the other hosts in step {HUNG_AT}"
    assert inside in detection["detail"] and "its workload process stopped" in detection["detail"]
