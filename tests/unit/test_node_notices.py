"""Announced losses (operator/notices.py): what a node's labels and taints say of its end, and the notice
each job pod on it gets: written once, kept while the node says the same, withdrawn when it stops.
The operator's store remembers what each node announced, and which pods run there."""

from __future__ import annotations

import json
from typing import Any

import pytest
from slicekeeper.operator.notices import (
    MAINTENANCE_TIME_LABEL,
    WATCH_CATCH_UP_SECONDS,
    NodeSignal,
    NoticeChange,
    NoticeKind,
    NoticesWritten,
    node_signal,
    notice_change,
)
from slicekeeper.operator.pod_store import PodStore

from slicekeeper import protocol

NOW = 1_760_000_000.0
MAINTENANCE = NodeSignal(NoticeKind.MAINTENANCE, 1_760_086_400, f"label {MAINTENANCE_TIME_LABEL}=1760086400")
TERMINATION = NodeSignal(
    NoticeKind.PREEMPTION, None, "taint cloud.google.com/impending-node-termination:NoSchedule"
)


def node(labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "tpu-a", "labels": labels or {}}, "spec": {"taints": taints or []}}


@pytest.mark.parametrize(
    ("labels", "taints", "signal"),
    [
        ({MAINTENANCE_TIME_LABEL: "1760086400"}, [], MAINTENANCE),
        (
            {},
            [{"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}],
            TERMINATION,
        ),
        (
            {},
            [{"key": "ToBeDeletedByClusterAutoscaler", "value": "1760000000", "effect": "NoSchedule"}],
            NodeSignal(NoticeKind.PREEMPTION, None, "taint ToBeDeletedByClusterAutoscaler:NoSchedule"),
        ),
        # Both: the termination is the sooner loss.
        (
            {MAINTENANCE_TIME_LABEL: "1760086400"},
            [{"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}],
            TERMINATION,
        ),
        # Negative controls: a TPU node's usual taint, a cordon, other GKE labels, an unreadable time.
        ({}, [{"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}], None),
        ({}, [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}], None),
        (
            {"cloud.google.com/gke-nodepool": "pool-a", "cloud.google.com/active-node-maintenance": "x"},
            [],
            None,
        ),
        ({MAINTENANCE_TIME_LABEL: "next-tuesday"}, [], None),
    ],
)
def test_a_node_announces_a_maintenance_or_a_termination_and_nothing_else(labels, taints, signal):
    assert node_signal(node(labels, taints)) == signal


def test_a_maintenance_notice_is_due_at_the_labels_time_and_names_the_label():
    change = notice_change(MAINTENANCE, None, grace_seconds=30, now=NOW)
    assert change is not None and change.value is not None
    assert json.loads(change.value) == {
        "kind": "maintenance",
        "at": 1_760_086_400,
        "source": "label cloud.google.com/scheduled-maintenance-time=1760086400",
    }


def test_a_preemption_notice_is_due_when_the_pods_grace_runs_out():
    for grace in (30, 600):  # (the pod's own terminationGracePeriodSeconds makes the difference)
        change = notice_change(TERMINATION, None, grace_seconds=grace, now=NOW)
        assert change is not None and change.value is not None
        assert json.loads(change.value)["kind"] == "preemption"
        assert json.loads(change.value)["at"] == NOW + grace


def test_the_same_notice_is_not_written_twice_even_as_time_passes():
    written = notice_change(TERMINATION, None, grace_seconds=30, now=NOW)
    assert written is not None
    assert notice_change(TERMINATION, written.value, grace_seconds=30, now=NOW + 10) is None
    kept = notice_change(MAINTENANCE, None, grace_seconds=30, now=NOW)
    assert kept is not None and notice_change(MAINTENANCE, kept.value, grace_seconds=30, now=NOW + 10) is None


def test_a_changed_announcement_replaces_the_notice_and_none_withdraws_it():
    written = notice_change(MAINTENANCE, None, grace_seconds=30, now=NOW)
    assert written is not None
    moved = NodeSignal(NoticeKind.MAINTENANCE, 1_760_172_800, f"label {MAINTENANCE_TIME_LABEL}=1760172800")
    rescheduled = notice_change(moved, written.value, grace_seconds=30, now=NOW)
    assert rescheduled is not None and json.loads(str(rescheduled.value))["at"] == 1_760_172_800
    preempted = notice_change(TERMINATION, written.value, grace_seconds=30, now=NOW)
    assert preempted is not None and json.loads(str(preempted.value))["kind"] == "preemption"
    assert notice_change(None, written.value, grace_seconds=30, now=NOW) == NoticeChange(None)
    assert notice_change(None, None, grace_seconds=30, now=NOW) is None  # nothing said, nothing held
    # An annotation that is not a notice (a hand-written one) is overwritten with one.
    assert notice_change(MAINTENANCE, "garbage", grace_seconds=30, now=NOW) == written


def pod(name: str, node_name: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": f"uid-{name}",
            "labels": {protocol.LABEL_JOB: "llm"},
            "annotations": {protocol.ANNOTATION_NOTICE: "{}"},
        },
        "spec": {"nodeName": node_name, "terminationGracePeriodSeconds": 90},
    }


def test_the_store_remembers_what_each_node_announced_and_which_pods_run_there():
    store = PodStore()
    store.observe("ADDED", pod("llm-s0-w0", "tpu-a"))
    store.observe("ADDED", pod("llm-s0-w1", "tpu-b"))
    assert store.node_signal("tpu-a") == (False, None)  # not seen yet: nothing to judge by
    assert store.observe_signal("tpu-a", MAINTENANCE) is None
    assert store.observe_signal("tpu-b", None) is None
    assert store.node_signal("tpu-a") == (True, MAINTENANCE) and store.node_signal("tpu-b") == (True, None)
    [on_a] = store.summaries_on("tpu-a")
    assert on_a["metadata"]["name"] == "llm-s0-w0"
    assert on_a["metadata"]["annotations"] == {protocol.ANNOTATION_NOTICE: "{}"}
    assert on_a["spec"]["terminationGracePeriodSeconds"] == 90
    assert store.observe_signal("tpu-a", None) == MAINTENANCE
    store.forget_node("tpu-a")
    assert store.node_signal("tpu-a") == (False, None)


def test_the_store_lists_the_nodes_that_announce_a_loss():
    store = PodStore()
    store.observe_signal("tpu-a", MAINTENANCE)
    store.observe_signal("tpu-b", None)
    assert store.announcing() == ["tpu-a"]


def test_a_replacement_is_kept_off_the_nodes_that_announce_a_loss_but_does_not_remember_them():
    """A pod made there would only be handed over again; once the maintenance is done the node is
    fine, so the host's own history (the avoid-nodes annotation) keeps only where it failed."""
    from slicekeeper.operator.hot_swap import AVOID_ANNOTATION, replacement
    from slicekeeper.operator.render import render

    from slicekeeper.api import TrainingJob
    from tests.support.operator_example import example

    rendered = render(TrainingJob.model_validate(example()))
    fresh = replacement(rendered, 1, ["tpu-b"], ["tpu-c"], hot_swaps=1)
    [term] = fresh["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"][0]["values"] == ["tpu-b", "tpu-c"]
    assert fresh["metadata"]["annotations"][AVOID_ANNOTATION] == "tpu-b"
    # Negative control: with no node announcing, only the node it failed on is avoided.
    plain = replacement(rendered, 1, ["tpu-b"], hot_swaps=1)
    assert plain["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]["matchExpressions"][0]["values"] == ["tpu-b"]


# --- the operator's own writes, until its watch shows them -----------------------------------------


def test_a_written_notice_counts_until_the_watch_shows_it_then_the_watch_does():
    written = NoticesWritten()
    written.wrote("uid-1", '{"kind": "maintenance"}', now=100.0)
    assert written.current("uid-1", None, now=101.0) == '{"kind": "maintenance"}'  # the watch is late
    assert written.current("uid-2", None, now=101.0) is None  # another pod: its own view
    assert written.current("uid-1", '{"kind": "maintenance"}', now=102.0) == '{"kind": "maintenance"}'
    # Caught up: from now on the watch says, a later change of anyone's included.
    assert written.current("uid-1", None, now=103.0) is None


def test_a_withdrawal_counts_until_the_watch_shows_it():
    written = NoticesWritten()
    written.wrote("uid-1", None, now=100.0)
    assert written.current("uid-1", '{"kind": "maintenance"}', now=101.0) is None
    assert written.current("uid-1", None, now=102.0) is None
    assert written.current("uid-1", '{"kind": "preemption"}', now=103.0) == '{"kind": "preemption"}'


def test_a_write_the_watch_never_shows_is_trusted_for_a_while_only():
    written = NoticesWritten()
    written.wrote("uid-1", "mine", now=100.0)
    assert written.current("uid-1", "theirs", now=100.0 + WATCH_CATCH_UP_SECONDS - 1) == "mine"
    assert written.current("uid-1", "theirs", now=100.0 + WATCH_CATCH_UP_SECONDS) == "theirs"
    written.wrote("uid-2", "mine", now=100.0)
    written.wrote("uid-3", "mine", now=100.0 + WATCH_CATCH_UP_SECONDS)  # forgets uid-2's
    assert written.current("uid-2", None, now=100.0) is None
