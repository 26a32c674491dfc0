"""A job whose first steps are slow, on every host or on one, is not restarted for a hang.

The first steps of a start take longer the wider the world (docs/supervisor.md, "Hang detection"):
at 16 hosts on a 2-core machine, every host waited in step 2 longer than the 2 s floor, the leader
restarted every host, the next start's step 2 was as slow, and false hangs spent the restart budget.
Here 4 hosts play it (tests/fixtures/slow_first_steps_loop.py): step 2 of every start keeps every
host waiting 2.6 s. The hang timer fires, no host stands out, and the leader asks again one
allowance later: by then every host went on, and the job trains to the end without a restart. Then
one host alone is slow in its own work of step 2 (a host starved of CPU): it is named for being
behind, asked about again one allowance later, found to have moved on, and not restarted.
"""

from __future__ import annotations

import sys

import pytest

from tests.support.cli_runs import ROOT, run_job

SLOW_FIRST_STEPS = ROOT / "tests" / "fixtures" / "slow_first_steps_loop.py"
STEPS = 80


@pytest.mark.parametrize(
    ("slow", "where"),
    [
        ([], "waiting for the other hosts in step 2"),
        (["--one-host", "2"], "host 2 is in its own work of step 2"),
    ],
    ids=["every-host-waits", "one-host-behind"],
)
def test_a_job_whose_first_steps_are_slow_trains_without_a_restart(tmp_path, slow, where):
    """Every host slow in the same place (no host stands out), or one host slow in its own work while
    the others wait for it (a host starved of CPU: named for being behind, then seen to move on). The
    leader that restarted a host behind at once failed the second (the suite's JAX runs did, on a
    saturated machine)."""
    result, report = run_job(
        tmp_path,
        steps=STEPS,
        workload={"command": [sys.executable, str(SLOW_FIRST_STEPS), *slow]},
        checkpoint={"interval": 4, "persistent": None},
        health={"maxRestarts": 2},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert report is not None and report["state"] == "succeeded"
    assert report["restarts"] == {}, report["detections"]
    assert report["detections"] == []
    assert report["steps_completed"] == STEPS
    # The silence was noticed, and found to be a slow step, not a hang.
    assert "not confirmed" in output and where in output, output[-3000:]
