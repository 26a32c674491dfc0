"""The leader hand-over on the reference JAX job: the leader's host lost, then a crash, nothing lost.

Host 0 leads the job at the start; losing it loses the leader, host 0's workload and its disk at
once. Another host is elected, carries on the job's memory, and a spare takes host 0 over from a
peer copy. A crash later is decided by the new leader with the whole history: the policy
(tests/fixtures/remembering_policy.py) fails the job unless its history starts with the host lost
before the hand-over, so a history lost with the leader fails this run.
"""

from __future__ import annotations

import pytest

from tests.support.cli_runs import ROOT, processes_mentioning
from tests.support.example_runs import STEPS, run_example
from tests.support.recovery_checks import problems

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.heavy]

REMEMBERING = str(ROOT / "tests" / "fixtures" / "remembering_policy.py")


def test_the_leaders_host_lost_then_a_crash_end_with_the_fault_free_parameters(tmp_path, clean):
    chaos = "lose:host=0@step=20,kill:host=2@step=45"
    report = run_example(tmp_path, "--spares", "1", "--chaos", chaos, policy={"file": REMEMBERING})
    assert report["exit_code"] == 0, report["stderr"][-3000:]
    assert problems(report, fingerprint=clean["report"]["params_fingerprint"], steps=STEPS) == []
    assert report["restarts"] == {"host_lost": 1, "crash": 1}
    assert [(s["host"], s["machine"]) for s in report["hot_swaps"]["details"]] == [(0, "spare-0")]
    [change] = report["leader_changes"]
    assert change["from_host"] == 0 and change["to_host"] in (1, 2, 3) and change["term"] == 2
    assert [d["event"]["kind"] for d in report["decisions"]] == ["host_lost", "crash"]
    assert report["decisions"][1]["action"]["name"] == "restart"
    assert processes_mentioning(report["run_dir"]) == []
