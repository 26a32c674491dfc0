"""The TrainingJob's status follows whichever host leads: the newest term's view wins
(operator/job_status.py `leader_view`), so a replaced leader's stale view no longer counts."""

from __future__ import annotations

import json
from typing import Any

from slicekeeper.operator.job_status import leader_view

from slicekeeper import protocol
from slicekeeper.api import parse_training_job
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
