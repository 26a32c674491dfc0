"""Losing the leader's host costs a restart, never the job: the hand-over, end to end.

The leader runs in one host's supervisor (host 0 at the start). When that host is lost, another host
takes the job's lease (supervisor.leader.election), carries on the newest journal a member holds, and
treats host 0 like any lost host: a stop, the policy's decision (here: a spare takes over), the next
generation. The job ends as if nothing happened to its parameters, and the report shows the hand-over.
"""

from __future__ import annotations

import sys

from tests.support.cli_runs import ROOT, processes_mentioning, run_job
from tests.support.recovery_checks import problems

STEPS = 40  # run_job's default
LOCKSTEP = ROOT / "tests" / "fixtures" / "lockstep_loop.py"


def test_losing_the_leaders_host_hands_the_job_to_another_host(tmp_path, clean_fingerprint):
    result, report = run_job(tmp_path, "--spares", "1", "--chaos", "lose:host=0@step=15")
    assert result.returncode == 0, result.stderr[-3000:]
    assert problems(report, fingerprint=clean_fingerprint, steps=STEPS) == []
    assert report["restarts"] == {"host_lost": 1}
    assert report["hot_swaps"]["hosts"] == [0]
    [change] = report["leader_changes"]
    assert (change["from_host"], change["from_machine"], change["term"]) == (0, "host-0", 2)
    assert change["to_host"] in (1, 2, 3) and 0 < change["leaderless_seconds"] < 15
    # The lost host's fault fired once: the old leader journaled it before its machine vanished, so the
    # spare that took host 0 over does not fire it again.
    assert [f["kind"] for f in report["faults"]] == ["lose"]
    assert "leader change: host 0 -> host" in result.stdout
    assert processes_mentioning(report["run_dir"]) == []


def test_the_hosts_stalled_by_the_lost_leader_are_not_blamed(tmp_path):
    """In lockstep the other hosts fail with the lost one (their barrier is gone): the restart is still
    put down to the lost host, not to a crash of the hosts that noticed."""
    result, report = run_job(
        tmp_path,
        "--spares",
        "1",
        "--chaos",
        "lose:host=0@step=12",
        steps=24,
        workload={"command": [sys.executable, str(LOCKSTEP)]},
        checkpoint={"interval": 4, "persistent": None},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert report["restarts"] == {"host_lost": 1}
    assert len(report["leader_changes"]) == 1 and report["hot_swaps"]["hosts"] == [0]
