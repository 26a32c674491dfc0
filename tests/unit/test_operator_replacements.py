"""A hot-swap's plan (operator/replacements.py): recorded once, finished by whoever comes next, taken
off once, each pod created once per plan."""

from __future__ import annotations

from slicekeeper.operator.replacements import Plan, Replacements, recorded

JOB = ("research", "tiny-lm")
POD = "tiny-lm-s1-w0"


def failed_pod(uid: str = "old", swaps: str | None = None) -> dict:
    annotations = {"slicekeeper.dev/hot-swaps": swaps} if swaps else {}
    return {"metadata": {"uid": uid, "annotations": annotations}, "spec": {"nodeName": "tpu-b"}}


def test_a_plan_carries_the_hosts_history_and_round_trips_through_the_status():
    plan = Plan.of(failed_pod(swaps="2"), "it failed")
    assert (plan.uid, plan.avoid_nodes, plan.hot_swaps) == ("old", ("tpu-b",), 3)
    assert recorded({"replacing": {POD: plan.record()}}) == {POD: plan}
    # A supervisor that could not reach its leader says nothing against its node.
    assert Plan.of(failed_pod(), "unreachable", node_at_fault=False).avoid_nodes == ()


def test_a_plan_is_recorded_once_and_its_pod_deleted_by_one_caller():
    replacements, plan = Replacements(), Plan.of(failed_pod(), "it failed")
    patch, delete = replacements.begin(JOB, {POD: plan}, {})
    assert patch == {"replacing": {POD: plan.record()}} and delete == [POD]
    assert replacements.begun(JOB, POD, "old")
    assert replacements.begin(JOB, {POD: plan}, {}) == ({}, [])  # the pod's event and the listing both ask


def test_a_restarted_operator_finishes_a_recorded_plan_without_writing_it_again():
    plan = Plan.of(failed_pod(), "it failed")
    status = {"replacing": {POD: plan.record()}}
    restarted = Replacements()
    assert restarted.plans(JOB, status) == {POD: plan}  # the pod found missing is created as planned
    assert restarted.begin(JOB, {POD: plan}, status) == ({}, [POD])  # still there: only the delete


def test_a_failed_delete_is_begun_again_by_the_next_caller():
    replacements, plan = Replacements(), Plan.of(failed_pod(), "it failed")
    replacements.begin(JOB, {POD: plan}, {})
    replacements.abandon(JOB, {POD: plan})
    assert not replacements.begun(JOB, POD, "old")
    assert replacements.begin(JOB, {POD: plan}, {})[1] == [POD]


def test_each_plan_creates_its_pod_once():
    replacements, plan = Replacements(), Plan.of(failed_pod(), "it failed")
    assert replacements.claim(JOB, POD, plan)
    assert not replacements.claim(JOB, POD, plan)  # the timer after the DELETED event's handler
    replacements.release(JOB, POD, plan)  # its create failed
    assert replacements.claim(JOB, POD, plan)
    later = Plan.of(failed_pod("new", swaps="1"), "it failed again")
    assert replacements.claim(JOB, POD, later)


def test_a_plan_is_taken_off_once_its_pod_is_back_and_only_once():
    replacements, plan = Replacements(), Plan.of(failed_pod(), "it failed")
    patch, _ = replacements.begin(JOB, {POD: plan}, {})
    status = {"replacing": patch["replacing"]}
    old = [{"metadata": {"name": POD, "uid": "old"}}]
    assert replacements.settled(JOB, old, status) == {}  # its delete is still to come
    assert replacements.settled(JOB, [], status) == {}  # deleted, not created yet
    new = [{"metadata": {"name": POD, "uid": "new"}}]
    assert replacements.settled(JOB, new, status) == {POD: None}
    assert replacements.settled(JOB, new, status) == {}  # the job's copy read next predates the patch
    assert replacements.settled(JOB, new, {}) == {}
