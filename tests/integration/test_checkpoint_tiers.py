"""`slicekeeper run` with the peer and persistent tiers: hot-swaps, fallbacks, and nothing lost.

The fast SDK example loop (50 ms steps, 4 hosts, a local save every 5 steps) stands in for the JAX
trainer; the JAX acceptance run is in tests/chaos. Every faulty run must end with the parameters of
the fault-free run.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.cli_runs import ROOT, processes_mentioning, run_job
from tests.support.recovery_checks import problems, recovery_summary

STEPS = 40  # run_job's default
CHECKPOINTED_LOCKSTEP = ROOT / "tests" / "fixtures" / "checkpointed_lockstep_loop.py"


def with_persistent(tmp_path, interval: int = 10, replicas: int = 1):
    uri = str(tmp_path / "persistent")
    return {"checkpoint": {"peer": {"replicas": replicas}, "persistent": {"uri": uri, "interval": interval}}}


def last_restore(report):
    generation = max(r["generation"] for r in report["restores"])
    return {r["host"]: r for r in report["restores"] if r["generation"] == generation}


# --- hot-swap ------------------------------------------------------------------------------------
def test_a_lost_host_is_replaced_by_a_spare_that_restores_its_shard_from_a_peer(tmp_path, clean_fingerprint):
    result, report = run_job(tmp_path, "--spares", "1", "--chaos", "lose:host=1@step=23")
    assert result.returncode == 0, result.stderr
    assert problems(report, fingerprint=clean_fingerprint, steps=STEPS) == []
    assert report["hot_swaps"]["count"] == 1 and report["hot_swaps"]["hosts"] == [1]
    restore = last_restore(report)
    assert {h: r["tier"] for h, r in restore.items()} == {0: "local", 1: "peer", 2: "local", 3: "local"}
    assert restore[1]["holder"] == 3  # the same worker on the other slice keeps host 1's replica
    assert report["restarts"] == {"host_lost": 1}
    assert report["faults"][0]["detected_as"] == "host_lost"
    assert report["faults"][0]["productive_at"] is not None
    host_1 = next(h for h in report["hosts"] if h["host"] == 1)
    assert host_1["machines"] == ["host-1", "spare-0"]
    assert "hot-swap: spare 0 (spare-0) takes over host 1" in result.stdout
    assert processes_mentioning(report["run_dir"]) == []


def test_negative_control_a_host_restoring_another_hosts_shard_ends_with_other_parameters(
    tmp_path, clean_fingerprint
):
    """The example loop keeps a shard of its own per host: a restore that hands host 1 host 0's
    (tests/fixtures/misrestoring_trainer.py) passes every restore record and is caught by the
    fingerprint alone."""
    workload = {
        "command": [sys.executable, str(ROOT / "tests" / "fixtures" / "misrestoring_trainer.py")],
        "env": [
            {"name": "SLICEKEEPER_TEST_MISRESTORE", "value": "other-host:1"},
            {"name": "SLICEKEEPER_TEST_TRAINER", "value": "sdk_loop"},
        ],
    }
    result, report = run_job(tmp_path, "--chaos", "kill:host=2@step=23", workload=workload)
    assert result.returncode == 0, result.stderr
    found = problems(report, fingerprint=clean_fingerprint, steps=STEPS)
    fingerprint = report["params_fingerprint"]
    assert found == [f"final parameters {fingerprint} differ from the fault-free run's {clean_fingerprint}"]
    workload_log = (Path(report["run_dir"]) / "host-1" / "workload.log").read_text()
    assert "host 1's shard is not its own: a wrong restore" in workload_log


def test_a_lost_host_without_a_peer_copy_restores_from_the_persistent_tier(tmp_path, clean_fingerprint):
    spec = with_persistent(tmp_path, interval=10, replicas=0)
    result, report = run_job(tmp_path, "--spares", "1", "--chaos", "lose:host=2@step=28", **spec)
    assert result.returncode == 0, result.stderr
    assert problems(report, fingerprint=clean_fingerprint, steps=STEPS) == []
    restore = last_restore(report)
    assert restore[2]["tier"] == "persistent"
    assert {restore[h]["tier"] for h in (0, 1, 3)} == {"local"}
    # The newest persistent step committed before the loss (20 unless the machine is very busy).
    assert restore[2]["step"] in (10, 20) and {r["step"] for r in restore.values()} == {restore[2]["step"]}
    assert report["persistent_reads"] == 1 and report["persistent_read_bytes"] > 0  # host 2's shard only
    assert report["persistent_checkpoints"] == [30, 40]  # retention: maxToKeep 2


def test_losing_a_host_with_no_spare_at_the_minimum_slices_fails_the_job_with_the_reason(tmp_path):
    result, report = run_job(tmp_path, "--chaos", "lose:host=3@step=12", minSlices=2)
    assert result.returncode == 1
    assert "host 3 lost: cannot replace it (no spare is available)" in result.stderr
    assert "spec.minSlices=2" in result.stderr
    assert report["state"] == "failed"
    assert processes_mentioning(report["run_dir"]) == []


def test_a_second_lost_host_is_replaced_by_the_next_spare(tmp_path, clean_fingerprint):
    result, report = run_job(tmp_path, "--spares", "2", "--chaos", "lose:host=1@step=12,lose:host=2@step=27")
    assert result.returncode == 0, result.stderr
    assert problems(report, fingerprint=clean_fingerprint, steps=STEPS) == []
    assert [(s["host"], s["machine"]) for s in report["hot_swaps"]["details"]] == [
        (1, "spare-0"),
        (2, "spare-1"),
    ]
    assert report["faults"][0]["step"] == 12 and len(report["faults"]) == 2  # each fired once


# --- integrity -----------------------------------------------------------------------------------
def test_a_corrupt_local_checkpoint_is_noticed_at_the_restore_and_taken_from_a_peer(
    tmp_path, clean_fingerprint
):
    """Host 2's step 15 corrupted at its step 16, host 0 killed at its step 19. The example loop's
    hosts never wait for each other, and on a loaded machine they drifted apart by more than the
    three steps between the two faults: host 2 behind (its corruption fired after the restart had
    read step 15) or ahead (its twin had dropped its replica of step 15 by retention, and the job
    restarted from nothing), each seen in a whole run of the suite. The same model in lockstep
    (tests/fixtures/checkpointed_lockstep_loop.py, the same fingerprint) keeps the faults in order."""
    workload = {"command": [sys.executable, str(CHECKPOINTED_LOCKSTEP)]}
    chaos = "corrupt:host=2@step=16,kill:host=0@step=19"
    result, report = run_job(tmp_path, "--chaos", chaos, workload=workload)
    assert result.returncode == 0, result.stderr
    assert problems(report, fingerprint=clean_fingerprint, steps=STEPS) == []
    [(cause, step, _)] = recovery_summary(report)
    assert (cause, step) == ("crash", 15)
    restore = last_restore(report)
    assert restore[2]["step"] == 15 and restore[2]["tier"] == "peer"
    assert {restore[h]["tier"] for h in (0, 1, 3)} == {"local"}
    log = (Path(report["run_dir"]) / "host-2" / "supervisor.log").read_text()
    assert "step 15 from local unusable" in log and "checksum mismatch" in log


def test_a_silently_bad_restored_state_is_caught_by_its_loss_and_an_older_step_restored(
    tmp_path, clean_fingerprint
):
    loop = ROOT / "tests" / "fixtures" / "silently_bad_checkpoint_loop.py"
    barrier = {"name": "SLICEKEEPER_TEST_BARRIER", "value": str(tmp_path / "committed-step-10")}
    workload = {
        "command": [sys.executable, str(loop)],
        "args": [],
        "steps": STEPS,
        "standby": False,
        "env": [barrier],
    }
    result, report = run_job(tmp_path, "--chaos", "kill:host=1@step=13", workload=workload)
    assert result.returncode == 0, result.stderr
    assert problems(report, fingerprint=clean_fingerprint, steps=STEPS) == []
    assert [d["kind"] for d in report["detections"]] == ["crash", "nonfinite_loss"]
    assert sorted({r["step"] for r in report["restores"]}) == [5, 10]  # 10 was bad, 5 was not
    assert report["restarts"] == {"crash": 1, "nonfinite_loss": 1}


# --- bad input -----------------------------------------------------------------------------------
def test_an_unwritable_persistent_location_is_reported_before_anything_starts(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    spec = {"checkpoint": {"persistent": {"uri": str(blocker / "checkpoints"), "interval": 10}}}
    result, report = run_job(tmp_path, **spec)
    assert result.returncode == 2
    assert "spec.checkpoint.persistent.uri" in result.stderr and str(blocker) in result.stderr
    assert report is None


def test_an_unknown_object_store_scheme_is_reported_before_anything_starts(tmp_path):
    spec = {"checkpoint": {"persistent": {"uri": "nosuchstore://bucket/checkpoints", "interval": 10}}}
    result, _ = run_job(tmp_path, **spec)
    assert result.returncode == 2
    assert "spec.checkpoint.persistent.uri" in result.stderr and "nosuchstore" in result.stderr
