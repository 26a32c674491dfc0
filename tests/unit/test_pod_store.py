"""The operator's pod store: a job's pods as its informer's listings and watch events describe them.

A listing is the whole state once it ends (a pod it lacks went while no watch could say so), except
for what the operator's own deletes said meanwhile; a job's read waits for the first listing. Nodes:
NotReady ones, and who runs there.
"""

from collections.abc import Callable
from typing import Any

import pytest
from slicekeeper.operator.pod_store import NotListedYet, PodStore, summary

NAMESPACE, JOB = "team", "llm"


def pod(
    name: str, *, phase: str = "Running", node: str | None = None, job: str = JOB, uid: str = ""
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": uid or f"uid-{name}",
            "labels": {"slicekeeper.dev/job": job, "slicekeeper.dev/slice": "0"},
            "annotations": {"slicekeeper.dev/replace": "straggler", "other.io/big": "x" * 1000},
            "resourceVersion": "12",
        },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 120,
            "containers": [{"name": "trainer", "image": "x"}],
        },
        "status": {
            "phase": phase,
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
        },
    }


def node(name: str, ready: str | None) -> dict[str, Any]:
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    return {"metadata": {"name": name}, "status": {"conditions": conditions}}


def listing(store: PodStore, pods: list[dict[str, Any]], during: Callable[[], object] | None = None) -> None:
    """An informer's listing of `pods`; `during` runs after its first page (one pod a page)."""
    store.listing_began(None)
    for index, listed in enumerate(pods):
        store.listed(None, listed)
        if index == 0 and during is not None:
            during()
    store.listing_ended(None)


def phases(store: PodStore, job: str = JOB) -> dict[str, str]:
    return {p["metadata"]["name"]: p["status"]["phase"] for p in store.pods(NAMESPACE, job, timeout=0)}


class TestSummary:
    def test_keeps_what_the_handlers_read_and_drops_the_rest(self) -> None:
        kept = summary(pod("llm-s0-w0", node="n1"))
        assert kept == {
            "metadata": {
                "name": "llm-s0-w0",
                "namespace": NAMESPACE,
                "uid": "uid-llm-s0-w0",
                "labels": {"slicekeeper.dev/job": JOB, "slicekeeper.dev/slice": "0"},
                "annotations": {"slicekeeper.dev/replace": "straggler"},
            },
            "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 120},  # (a preemption notice's at)
            "status": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]},
        }


class TestListings:
    def test_a_read_waits_for_the_first_listing(self) -> None:
        store = PodStore()
        with pytest.raises(NotListedYet, match="still being listed"):
            store.pods(NAMESPACE, JOB, timeout=0.01)
        store.listing_began(None)
        store.listed(None, pod("llm-s0-w0"))
        assert not store.listed_once(timeout=0)
        store.listing_ended(None)
        assert store.listed_once(timeout=0) and phases(store) == {"llm-s0-w0": "Running"}

    def test_every_namespace_s_first_listing_is_waited_for(self) -> None:
        store = PodStore(["a", "b"])
        store.listing_began("a")
        store.listing_ended("a")
        assert not store.listed_once(timeout=0)
        store.listing_began("b")
        store.listing_ended("b")
        assert store.listed_once(timeout=0)

    def test_a_listing_then_the_watch_events(self) -> None:
        store = PodStore()
        listing(store, [pod("llm-s0-w0"), pod("llm-s0-w1", phase="Pending")])
        assert phases(store) == {"llm-s0-w0": "Running", "llm-s0-w1": "Pending"}
        store.observe("MODIFIED", pod("llm-s0-w1"))
        store.observe("DELETED", pod("llm-s0-w0"))
        assert phases(store) == {"llm-s0-w1": "Running"}

    def test_a_pod_the_next_listing_lacks_went_in_the_watch_gap(self) -> None:
        store = PodStore()
        listing(store, [pod("llm-s0-w0"), pod("llm-s0-w1"), pod("other-s0-w0", job="other")])
        listing(store, [pod("llm-s0-w1", phase="Failed")])  # after a 410: the rest went meanwhile
        assert phases(store) == {"llm-s0-w1": "Failed"}
        assert phases(store, "other") == {}

    def test_a_listing_of_one_namespace_leaves_the_others_alone(self) -> None:
        store = PodStore(["team", "elsewhere"])
        for scope in ("team", "elsewhere"):
            store.listing_began(scope)
            store.listing_ended(scope)
        store.observe("ADDED", pod("llm-s0-w0"))
        store.listing_began("elsewhere")
        store.listing_ended("elsewhere")
        assert phases(store) == {"llm-s0-w0": "Running"}

    def test_a_pod_the_operator_deleted_leaves_at_once_and_a_later_page_does_not_bring_it_back(self) -> None:
        store = PodStore()
        listing(store, [pod("llm-s0-w0", phase="Failed"), pod("llm-s0-w1")])
        store.deleted(NAMESPACE, JOB, "llm-s0-w0", "uid-other")  # another pod of the name: kept
        assert "llm-s0-w0" in phases(store)
        store.deleted(NAMESPACE, JOB, "llm-s0-w0", "uid-llm-s0-w0")
        assert phases(store) == {"llm-s0-w1": "Running"}
        listing(  # a listing whose second page was taken before the delete
            store,
            [pod("llm-s0-w1"), pod("llm-s0-w0", phase="Failed")],
            during=lambda: store.deleted(NAMESPACE, JOB, "llm-s0-w0", "uid-llm-s0-w0"),
        )
        assert phases(store) == {"llm-s0-w1": "Running"}
        store.observe("ADDED", pod("llm-s0-w0", phase="Pending", uid="uid-new"))  # its replacement
        assert phases(store) == {"llm-s0-w0": "Pending", "llm-s0-w1": "Running"}

    def test_a_pod_changed_during_a_listing_is_not_dropped_at_its_end(self) -> None:
        """(The informer's own watch events never come during its listing; the operator's deletes and
        another scope's events may.)"""
        store = PodStore()
        listing(store, [pod("llm-s0-w0")])
        listing(store, [pod("llm-s0-w0")], during=lambda: store.observe("ADDED", pod("llm-s0-w9")))
        assert sorted(phases(store)) == ["llm-s0-w0", "llm-s0-w9"]

    def test_jobs_are_kept_apart(self) -> None:
        store = PodStore()
        listing(store, [pod("other-s0-w0", job="other")])
        assert phases(store) == {}
        assert phases(store, "other") == {"other-s0-w0": "Running"}

    def test_a_deleted_job_drops_its_pods_and_its_successor_follows_the_events(self) -> None:
        store = PodStore()
        listing(store, [pod("llm-s0-w0")])
        store.forget_job(NAMESPACE, JOB)
        store.observe("DELETED", pod("llm-s0-w0"))  # the finalizer's deletes, seen after
        assert phases(store) == {}
        store.observe("ADDED", pod("llm-s0-w0", phase="Pending", uid="uid-again"))  # the job created again
        assert phases(store) == {"llm-s0-w0": "Pending"}

    def test_a_late_deleted_event_of_an_earlier_pod_does_not_drop_its_successor(self) -> None:
        store = PodStore()
        listing(store, [])
        store.observe("ADDED", pod("llm-s0-w0", uid="new"))
        store.observe("DELETED", pod("llm-s0-w0", uid="old"))
        assert phases(store) == {"llm-s0-w0": "Running"}


class TestNodes:
    def test_not_ready_nodes_and_their_pods(self) -> None:
        store = PodStore()
        store.observe("ADDED", pod("llm-s0-w0", node="n1"))
        store.observe("ADDED", pod("llm-s0-w1", node="n2"))
        assert store.observe_node(node("n1", "False"))
        assert not store.observe_node(node("n2", "True"))
        assert not store.node_ready("n1") and store.node_ready("n2") and store.node_ready(None)
        assert store.pods_on("n1") == [(NAMESPACE, "llm-s0-w0")]

    def test_a_node_without_a_ready_condition_is_not_judged(self) -> None:
        store = PodStore()
        assert not store.observe_node(node("n1", None))
        assert store.node_ready("n1")

    def test_a_node_ready_again_is_forgiven(self) -> None:
        store = PodStore()
        store.observe_node(node("n1", "Unknown"))
        store.observe_node(node("n1", "True"))
        assert store.node_ready("n1")

    def test_a_pod_moved_or_deleted_leaves_its_node(self) -> None:
        store = PodStore()
        store.observe("ADDED", pod("llm-s0-w0", node="n1"))
        store.observe("MODIFIED", pod("llm-s0-w0", node="n2"))
        assert store.pods_on("n1") == [] and store.pods_on("n2") == [(NAMESPACE, "llm-s0-w0")]
        store.observe("DELETED", pod("llm-s0-w0", node="n2"))
        assert store.pods_on("n2") == []
