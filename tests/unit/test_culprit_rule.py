"""Naming a hang's culprit from where each host's workload was (supervisor.signals.culprit).

Every case has a reporter that is not the culprit, so a rule that named the reporter (what the
leader did before) fails each of them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from slicekeeper.supervisor.signals.culprit import (
    Activity,
    ActivityTracker,
    Evidence,
    Stage,
    name_culprit,
    process_state,
)


def at(step: int, stage: Stage, silent: float = 2.0, phase: str = "idle") -> Activity:
    return Activity(step, stage, phase, silent)


@pytest.mark.parametrize("stopped", [0, 1, 2, 3])
def test_the_host_still_in_its_own_work_is_named_while_the_others_wait_for_it(stopped):
    activities = {h: at(41, Stage.WORK_DONE, silent=2.1) for h in range(4)}
    activities[stopped] = at(41, Stage.BEGUN, silent=2.15)
    reporter = (stopped + 1) % 4
    culprit = name_culprit(activities, reporter)
    assert (culprit.host, culprit.evidence) == (stopped, Evidence.BEHIND)
    assert culprit.reason.startswith(f"host {stopped} is in its own work of step 41")
    assert "the others are waiting for the other hosts in step 41" in culprit.reason


def test_a_host_stopped_between_steps_is_named_while_the_others_began_the_next():
    activities = {
        0: at(41, Stage.WORK_DONE),
        1: at(40, Stage.ENDED, phase="checkpoint_save"),
        2: at(41, Stage.BEGUN),
    }
    culprit = name_culprit(activities, reporter=0)
    assert culprit.host == 1
    assert "after step 40 (checkpoint_save)" in culprit.reason


def test_a_host_whose_supervisor_does_not_answer_is_named():
    culprit = name_culprit({0: at(41, Stage.WORK_DONE), 1: at(41, Stage.BEGUN), 2: None}, reporter=0)
    assert (culprit.host, culprit.reason) == (2, "the supervisor of host 2 did not answer")
    assert culprit.evidence is Evidence.HALTED


def test_with_every_host_at_the_same_stage_the_reporter_is_named_and_the_reason_says_why():
    activities = {h: at(41, Stage.WORK_DONE, silent=2.0 + h) for h in range(4)}
    culprit = name_culprit(activities, reporter=2)
    assert (culprit.host, culprit.evidence) == (2, Evidence.NONE)
    assert culprit.reason == "no host stands out: every host is waiting for the other hosts in step 41"


def test_among_hosts_equally_far_behind_the_one_silent_longest_is_named():
    activities = {
        0: at(41, Stage.WORK_DONE),
        1: at(41, Stage.BEGUN, silent=2.0),
        2: at(41, Stage.BEGUN, silent=3.5),
    }
    assert name_culprit(activities, reporter=1).host == 2


def test_an_activity_survives_its_message():
    activity = at(7, Stage.WORK_DONE, silent=1.23456, phase="checkpoint_save")
    assert Activity.from_message(activity.to_message()) == at(7, Stage.WORK_DONE, 1.235, "checkpoint_save")


def test_the_tracker_follows_a_workloads_events():
    tracker = ActivityTracker()
    tracker.restart(100.0, restore_step=30)
    assert tracker.snapshot(101.0) == at(30, Stage.ENDED, silent=1.0)
    tracker.step_begun(102.0, 31)
    tracker.work_done(102.5, 30)  # a late word about an older step changes nothing
    assert tracker.snapshot(103.0) == at(31, Stage.BEGUN, silent=1.0)
    tracker.work_done(102.5, 31)
    assert tracker.snapshot(103.0).stage is Stage.WORK_DONE
    tracker.step_ended(103.0, 31)
    tracker.phase(103.5, "checkpoint_save")
    assert tracker.snapshot(104.0) == at(31, Stage.ENDED, silent=0.5, phase="checkpoint_save")
    tracker.other(105.0)
    assert tracker.snapshot(105.0).silent_seconds == 0.0


# --- evidence that does not depend on where in the step the host stopped --------------------------


@pytest.mark.parametrize("stopped", [0, 1, 2, 3])
def test_a_host_stopped_inside_the_collective_is_named_by_its_process(stopped):
    """Every host waits in the collective of step 41, the stopped one too: stages alone name nobody."""
    activities = {h: at(41, Stage.WORK_DONE) for h in range(4)}
    activities[stopped] = Activity(41, Stage.WORK_DONE, "idle", 2.0, process="stopped")
    culprit = name_culprit(activities, reporter=(stopped + 1) % 4)
    assert (culprit.host, culprit.evidence) == (stopped, Evidence.HALTED)
    where = f"host {stopped} is waiting for the other hosts in step 41, silent 2.0 s"
    assert culprit.reason.startswith(f"{where}, its workload process stopped")


def test_negative_control_without_the_process_no_host_stands_out():
    activities = {h: at(41, Stage.WORK_DONE) for h in range(4)}
    culprit = name_culprit(activities, reporter=1)
    assert (culprit.host, culprit.evidence) == (1, Evidence.NONE)


def test_every_workload_gone_names_nobody_by_its_process():
    """All gone (the job is being torn down): no evidence against one host."""
    activities = {h: Activity(41, Stage.WORK_DONE, "idle", 2.0, process="gone") for h in range(3)}
    assert name_culprit(activities, reporter=1).evidence is Evidence.NONE


def test_the_state_of_a_process_is_read_from_proc():
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert process_state(child.pid) == "running"
        os.kill(child.pid, signal.SIGSTOP)
        for _ in range(100):
            if process_state(child.pid) == "stopped":
                break
            time.sleep(0.01)
        assert process_state(child.pid) == "stopped"
    finally:
        child.kill()
        child.wait()
    assert process_state(child.pid) == "gone" and process_state(None) == "gone"
