"""The operator's pod store: a job's pods from the watch events, filled by one listing on first read.

A restarted operator resumes a job before its pod watch has delivered every pod, so the first read of
a job lists its pods; events that arrive around that listing must win over it (a pod deleted or
changed meanwhile is not brought back in its listed state). Nodes: NotReady ones, and who runs there.
"""

from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from slicekeeper.operator.pod_store import PodStore, summary

NAMESPACE, JOB = "team", "llm"


def pod(name: str, *, phase: str = "Running", node: str | None = None, job: str = JOB) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"slicekeeper.dev/job": job, "slicekeeper.dev/slice": "0"},
            "annotations": {"slicekeeper.dev/replace": "straggler", "other.io/big": "x" * 1000},
            "resourceVersion": "12",
        },
        "spec": {"nodeName": node, "containers": [{"name": "trainer", "image": "x"}]},
        "status": {
            "phase": phase,
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
        },
    }


def node(name: str, ready: str | None) -> dict[str, Any]:
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    return {"metadata": {"name": name}, "status": {"conditions": conditions}}


class Lister:
    """A listing of the job's pods; `during` runs while it is being read (events arriving meanwhile)."""

    def __init__(self, pods: list[dict[str, Any]], during: Any = None) -> None:
        self.pods, self.during, self.calls = pods, during, 0

    def __call__(self) -> Iterable[Mapping[str, Any]]:
        self.calls += 1
        if self.during is not None:
            self.during()
        return list(self.pods)


def phases(store: PodStore, lister: Lister) -> dict[str, str]:
    return {p["metadata"]["name"]: p["status"]["phase"] for p in store.pods(NAMESPACE, JOB, lister)}


class TestSummary:
    def test_keeps_what_the_handlers_read_and_drops_the_rest(self) -> None:
        kept = summary(pod("llm-s0-w0", node="n1"))
        assert kept == {
            "metadata": {
                "name": "llm-s0-w0",
                "namespace": NAMESPACE,
                "labels": {"slicekeeper.dev/job": JOB, "slicekeeper.dev/slice": "0"},
                "annotations": {"slicekeeper.dev/replace": "straggler"},
            },
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]},
        }


class TestFirstRead:
    def test_lists_the_job_once_then_follows_the_events(self) -> None:
        store = PodStore()
        lister = Lister([pod("llm-s0-w0"), pod("llm-s0-w1", phase="Pending")])
        assert phases(store, lister) == {"llm-s0-w0": "Running", "llm-s0-w1": "Pending"}
        store.observe(None, pod("llm-s0-w1"))
        store.observe("DELETED", pod("llm-s0-w0"))
        assert phases(store, lister) == {"llm-s0-w1": "Running"}
        assert lister.calls == 1

    def test_an_event_before_the_listing_wins_over_it(self) -> None:
        store = PodStore()
        store.observe("MODIFIED", pod("llm-s0-w0", phase="Failed"))
        lister = Lister([pod("llm-s0-w0", phase="Running"), pod("llm-s0-w1")])
        assert phases(store, lister) == {"llm-s0-w0": "Failed", "llm-s0-w1": "Running"}

    def test_a_pod_deleted_while_listing_is_not_brought_back(self) -> None:
        store = PodStore()
        lister = Lister(
            [pod("llm-s0-w0"), pod("llm-s0-w1")],
            during=lambda: store.observe("DELETED", pod("llm-s0-w1")),
        )
        assert phases(store, lister) == {"llm-s0-w0": "Running"}

    def test_a_pod_changed_while_listing_keeps_the_event_state(self) -> None:
        store = PodStore()
        lister = Lister(
            [pod("llm-s0-w0", phase="Pending")],
            during=lambda: store.observe("MODIFIED", pod("llm-s0-w0", phase="Running")),
        )
        assert phases(store, lister) == {"llm-s0-w0": "Running"}

    def test_a_failed_listing_is_tried_again_on_the_next_read(self) -> None:
        store = PodStore()

        def broken() -> list[dict[str, Any]]:
            raise ConnectionError("API server away")

        with pytest.raises(ConnectionError):
            store.pods(NAMESPACE, JOB, broken)
        assert phases(store, Lister([pod("llm-s0-w0")])) == {"llm-s0-w0": "Running"}

    def test_jobs_are_kept_apart(self) -> None:
        store = PodStore()
        store.observe(None, pod("other-s0-w0", job="other"))
        assert phases(store, Lister([])) == {}
        assert [p["metadata"]["name"] for p in store.pods(NAMESPACE, "other", Lister([]))] == ["other-s0-w0"]

    def test_a_deleted_job_drops_its_pods_and_its_successor_follows_the_events(self) -> None:
        store = PodStore()
        assert phases(store, Lister([pod("llm-s0-w0")])) == {"llm-s0-w0": "Running"}
        store.forget_job(NAMESPACE, JOB)
        store.observe("DELETED", pod("llm-s0-w0"))  # the finalizer's deletes, seen after
        lister = Lister([pod("llm-s0-w0", phase="Pending")])
        assert phases(store, lister) == {}
        store.observe("ADDED", pod("llm-s0-w0", phase="Pending"))  # the job created again
        assert phases(store, lister) == {"llm-s0-w0": "Pending"}
        assert lister.calls == 0


class TestNodes:
    def test_not_ready_nodes_and_their_pods(self) -> None:
        store = PodStore()
        store.observe(None, pod("llm-s0-w0", node="n1"))
        store.observe(None, pod("llm-s0-w1", node="n2"))
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
        store.observe(None, pod("llm-s0-w0", node="n1"))
        store.observe("MODIFIED", pod("llm-s0-w0", node="n2"))
        assert store.pods_on("n1") == [] and store.pods_on("n2") == [(NAMESPACE, "llm-s0-w0")]
        store.observe("DELETED", pod("llm-s0-w0", node="n2"))
        assert store.pods_on("n2") == []
