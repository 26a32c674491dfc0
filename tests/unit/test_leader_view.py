"""The TrainingJob's status follows whichever host leads: the newest term's view wins
(operator/job_status.py `leader_view`), so a replaced leader's stale view no longer counts."""

from __future__ import annotations

import json
from typing import Any

from slicekeeper.operator.job_status import derive, leader_view
from slicekeeper.supervisor.leader.journal import JobMemory
from slicekeeper.supervisor.leader.restart_state import JobState, RestartState
from slicekeeper.supervisor.leader.status import cluster_status
from slicekeeper.supervisor.leader.world import JobWorld

from slicekeeper import protocol
from slicekeeper.api import parse_training_job
from slicekeeper.leader_view import encode
from slicekeeper.shape import JobShape
from tests.support.operator_example import EXAMPLE

JOB = parse_training_job(EXAMPLE, "the example")


def pod(name: str, view: dict[str, Any] | None) -> dict[str, Any]:
    annotations = {protocol.ANNOTATION_STATUS: json.dumps(view)} if view is not None else {}
    return {"metadata": {"name": name, "annotations": annotations}}


def test_the_view_of_the_newest_term_wins_wherever_it_is_published():
    pods = [
        pod("tiny-lm-s0-w0", {"term": 1, "step": 59}),  # the old leader, fenced
        pod("tiny-lm-s1-w1", {"term": 2, "step": 80}),  # the leader elected in its place
        pod("tiny-lm-s0-w1", None),
    ]
    assert leader_view(JOB, pods) == {"term": 2, "step": 80}


def test_without_terms_the_first_hosts_view_is_the_leaders():
    pods = [pod("tiny-lm-s1-w0", {"step": 3}), pod("tiny-lm-s0-w0", {"step": 7})]
    assert leader_view(JOB, pods) == {"step": 7}
    assert leader_view(JOB, [pod("tiny-lm-s0-w0", None)]) is None


def test_the_view_the_leader_publishes_is_the_view_the_operator_reads():
    memory = JobMemory(started_at=0.0, restart=RestartState(JobState.RUNNING, generation=2), high_water=80)
    memory.restarts["crash"] = 1
    memory.recoveries.append({"generation": 2, "cause": "crash", "restore_step": 70, "steps_replayed": 4})
    published = cluster_status(memory, JobWorld(JobShape(2, 2)), 70, [3], term=4, params_fingerprint=None)
    published["goodput"] = 0.9
    text = encode(published)
    pods = [{"metadata": {"name": "tiny-lm-s1-w0", "annotations": {protocol.ANNOTATION_STATUS: text}}}]
    assert leader_view(JOB, pods) == published
    status = derive(JOB, pods, {}).status
    assert (status["step"], status["slicesActive"], status["lastCheckpointStep"]) == (80, 2, 70)
    assert status["lastRestore"] == {"generation": 2, "cause": "crash", "step": 70, "stepsReplayed": 4}
    assert (status["restarts"], status["goodput"]) == ({"crash": 1, "replace": 0}, 0.9)


def test_a_view_that_is_not_one_is_not_taken_for_the_leaders():
    pods = [
        pod("tiny-lm-s0-w0", {"term": 1, "step": 59}),
        pod("tiny-lm-s1-w1", {"term": 2, "step": "eighty"}),  # unreadable: does not hide the valid one
    ]
    assert leader_view(JOB, pods) == {"term": 1, "step": 59}
