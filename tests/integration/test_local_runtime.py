"""`slicekeeper run` end to end with the fast SDK example loop: supervisors, restarts, report.

Every run is checked against the parameters the loop must end with (`sdk_loop_fingerprint`), not
against another run: two runs that both trained nothing would agree with each other.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli_runs import (
    processes_mentioning,
    read_report,
    run_job,
    sdk_loop_fingerprint,
    sdk_loop_job,
    started_cli,
)

REQUIRED_FIELDS = {
    "steps_completed",
    "goodput",
    "badput_seconds",
    "restarts",
    "faults",
    "params_fingerprint",
    "wall_seconds",
}


def test_a_fault_free_run_succeeds_with_a_complete_report(tmp_path):
    result, report = run_job(tmp_path)
    assert result.returncode == 0, result.stderr
    assert report.keys() >= REQUIRED_FIELDS
    assert report["state"] == "succeeded"
    assert report["steps_completed"] == 40
    assert 0 < report["goodput"] <= 1
    assert report["restarts"] == {} and report["faults"] == []
    assert report["params_fingerprint"] == sdk_loop_fingerprint(40)
    total = report["goodput"] + sum(report["badput_seconds"].values()) / report["wall_seconds"]
    assert total == pytest.approx(1.0, abs=0.01)
    assert "metrics: host 0 http://127.0.0.1:" in result.stdout
    assert "step " in result.stdout and "steps/s" in result.stdout  # live progress
    assert processes_mentioning(report["run_dir"]) == []


def test_a_killed_and_a_hung_host_recover_with_nothing_lost(tmp_path):
    result, report = run_job(tmp_path, "--chaos", "kill:host=1@step=12,hang:host=3@step=27")
    assert result.returncode == 0, result.stderr
    assert report["params_fingerprint"] == sdk_loop_fingerprint(40)
    assert report["restarts"] == {"crash": 1, "hang": 1}
    assert [(f["kind"], f["host"], f["step"]) for f in report["faults"]] == [("kill", 1, 12), ("hang", 3, 27)]
    for fault in report["faults"]:  # each fired exactly once, was detected, and training went on
        assert fault["detected_at"] >= fault["fired_at"]
        assert fault["resumed_at"] >= fault["detected_at"]
    # Beyond the pre-fault high-water mark. (Not asserted for the hang: the example loop's hosts do
    # not share collectives, so the others may run to the end before the hang is detected.)
    assert report["faults"][0]["productive_at"] >= report["faults"][0]["resumed_at"]
    assert report["faults"][0]["detected_as"] == "crash" and report["faults"][1]["detected_as"] == "hang"
    assert report["badput_seconds"]["infrastructure_recovery"] > 0
    assert processes_mentioning(report["run_dir"]) == []


def test_a_spent_restart_budget_fails_the_job_with_the_reason(tmp_path):
    result, report = run_job(
        tmp_path, "--chaos", "kill:host=0@step=8,kill:host=2@step=14", health={"maxRestarts": 1}
    )
    assert result.returncode == 1
    assert "restart budget spent: 1 in-job restarts (spec.health.maxRestarts)" in result.stderr
    assert report["state"] == "failed"
    assert processes_mentioning(report["run_dir"]) == []


def test_a_workload_that_crashes_at_every_start_fails_fast(tmp_path):
    result, report = run_job(
        tmp_path,
        workload={"command": [sys.executable, "-c", "import sys; sys.exit(3)"]},
        health={"maxRestarts": 10, "maxRestartsWithoutProgress": 3},
    )
    assert result.returncode == 1
    assert "no progress across 3 consecutive starts (spec.health.maxRestartsWithoutProgress)" in result.stderr
    assert "workload exit code 3" in result.stderr
    assert report["restarts"] == {"crash": 2}
    assert processes_mentioning(report["run_dir"]) == []


def test_ctrl_c_stops_every_process_it_started(tmp_path):
    job = sdk_loop_job(tmp_path / "job.yaml", steps=100000)
    with started_cli("run", str(job), "--report", str(tmp_path / "r.json")) as process:
        assert process.stdout is not None
        run_dir = None
        deadline = time.time() + 60
        for line in process.stdout:
            if "run directory:" in line:
                run_dir = line.split("run directory:")[1].split()[0]
            if ("steps/s" in line and "training" in line) or time.time() > deadline:
                break
        assert run_dir is not None
        assert processes_mentioning(run_dir), "the job should be running"
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=30)
    assert process.returncode == 1
    assert "interrupted" in out
    assert read_report(tmp_path / "r.json")["state"] == "interrupted"
    assert processes_mentioning(run_dir) == []


def test_a_standby_process_takes_over_at_each_restart_with_nothing_lost(tmp_path):
    result, report = run_job(
        tmp_path, "--chaos", "kill:host=1@step=8,hang:host=3@step=35", workload={"standby": True}
    )
    assert result.returncode == 0, result.stderr
    assert report["params_fingerprint"] == sdk_loop_fingerprint(40)
    assert report["restarts"] == {"crash": 1, "hang": 1}
    for host in range(4):
        events = (Path(report["run_dir"]) / f"host-{host}" / "events.jsonl").read_text()
        # A standby starts after a generation's first step; the hang restart comes seconds after the
        # kill restart, so its standby is ready. One not yet ready (e.g. the kill restart, on a loaded
        # machine) is replaced by a fresh start.
        assert events.count('"standby_promoted"') >= 1
    assert processes_mentioning(report["run_dir"]) == []  # the last, unused standby too


def test_a_workload_that_cannot_be_started_fails_the_job_with_the_reason(tmp_path):
    result, report = run_job(tmp_path, workload={"command": ["/nonexistent/trainer"]})
    assert result.returncode == 1
    assert "cannot start the workload '/nonexistent/trainer'" in result.stderr
    assert "no progress across 3 consecutive starts" in result.stderr
    assert processes_mentioning(report["run_dir"]) == []
