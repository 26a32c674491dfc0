"""The operator's pod store: a job's pods from the watch events, filled by one listing on first read.

A restarted operator resumes a job before its pod watch has delivered every pod, so the first read of
a job lists its pods; events that arrive around that listing must win over it (a pod deleted or
changed meanwhile is not brought back in its listed state). When kopf's watch lists again (after a
410 Gone), a pod deleted meanwhile is not in that listing and no event says it went: the store must
notice the re-list and list the job again. Nodes: NotReady ones, and who runs there.
"""

from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from slicekeeper.operator.pod_store import PodStore, summary

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
                "uid": "uid-llm-s0-w0",
                "labels": {"slicekeeper.dev/job": JOB, "slicekeeper.dev/slice": "0"},
                "annotations": {"slicekeeper.dev/replace": "straggler"},
            },
            "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 120},  # (a preemption notice's at)
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

    def test_a_pod_the_operator_deleted_leaves_at_once_though_no_event_tells_of_it(self) -> None:
        """Deleted while kopf's listing was under way, the pod is in no listing of kopf's and no
        DELETED event comes: the operator's word is all there is (a replacement's own ADDED event
        puts the pod back)."""
        store = PodStore()
        lister = Lister([pod("llm-s0-w0", phase="Failed"), pod("llm-s0-w1")])
        assert phases(store, lister) == {"llm-s0-w0": "Failed", "llm-s0-w1": "Running"}
        store.deleted(NAMESPACE, JOB, "llm-s0-w0", "uid-other")  # another pod of the name: kept
        assert "llm-s0-w0" in phases(store, lister)
        store.deleted(NAMESPACE, JOB, "llm-s0-w0", "uid-llm-s0-w0")
        assert phases(store, lister) == {"llm-s0-w1": "Running"}
        store.observe("ADDED", pod("llm-s0-w0", phase="Pending", uid="uid-new"))
        assert phases(store, lister) == {"llm-s0-w0": "Pending", "llm-s0-w1": "Running"}
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


class TestRelisting:
    """kopf lists again after its watch got 410 Gone: every pod still there arrives as an event of
    type None, a pod deleted during the gap does not arrive at all."""

    def test_a_second_listing_event_for_a_pod_makes_the_next_read_list_the_job_again(self) -> None:
        store = PodStore()
        for name in ("llm-s0-w0", "llm-s0-w1"):
            store.observe(None, pod(name))  # kopf's first listing
        lister = Lister([pod("llm-s0-w0"), pod("llm-s0-w1")])
        assert sorted(phases(store, lister)) == ["llm-s0-w0", "llm-s0-w1"]
        store.observe(None, pod("llm-s0-w0"))  # listed again: llm-s0-w1 was deleted in the gap
        lister.pods = [pod("llm-s0-w0")]
        assert phases(store, lister) == {"llm-s0-w0": "Running"}
        assert lister.calls == 2
        store.observe(None, pod("llm-s0-w0", uid="uid-other"))  # a new pod in the same listing
        assert phases(store, lister) == {"llm-s0-w0": "Running"} and lister.calls == 2  # listed once

    def test_a_pod_the_watch_streamed_and_then_listed_means_a_relist(self) -> None:
        store = PodStore()
        lister = Lister([pod("llm-s0-w0"), pod("llm-s0-w1")])
        phases(store, lister)
        store.observe("MODIFIED", pod("llm-s0-w0"))
        store.observe("MODIFIED", pod("llm-s0-w1"))
        store.observe(None, pod("llm-s0-w1"))
        lister.pods = [pod("llm-s0-w1")]
        assert phases(store, lister) == {"llm-s0-w1": "Running"} and lister.calls == 2

    def test_a_relist_is_noticed_for_every_job_whichever_job_s_pod_showed_it(self) -> None:
        store = PodStore()
        store.observe(None, pod("other-s0-w0", job="other"))
        lister = Lister([pod("llm-s0-w0")])
        assert phases(store, lister) == {"llm-s0-w0": "Running"}
        store.observe(None, pod("other-s0-w0", job="other"))  # llm's only pod went in the gap
        lister.pods = []
        assert phases(store, lister) == {}

    def test_events_during_the_new_listing_still_win_over_it(self) -> None:
        store = PodStore()
        store.observe(None, pod("llm-s0-w0"))
        phases(store, Lister([pod("llm-s0-w0")]))
        store.observe(None, pod("llm-s0-w0"))
        lister = Lister(
            [pod("llm-s0-w0", phase="Running")],
            during=lambda: (
                store.observe("MODIFIED", pod("llm-s0-w0", phase="Failed")),
                store.observe("ADDED", pod("llm-s0-w9", phase="Pending")),
            ),
        )
        assert phases(store, lister) == {"llm-s0-w0": "Failed", "llm-s0-w9": "Pending"}

    def test_a_pod_the_api_server_no_longer_has_makes_the_next_read_list_the_job_again(self) -> None:
        """Every pod of the job went in the gap: no listing event shows the re-list. The timer asks
        the API server about one pod in turn; a pod the store has and the server has not (or has as
        another pod) is the sign."""
        store = PodStore()
        lister = Lister([pod("llm-s0-w0"), pod("llm-s0-w1")])
        phases(store, lister)
        asked: list[str] = []

        def server(name: str) -> str | None:
            asked.append(name)
            return {"llm-s0-w0": "uid-llm-s0-w0"}.get(name)

        assert store.verify(NAMESPACE, JOB, server)  # llm-s0-w0: as the store says
        assert phases(store, lister) == {"llm-s0-w0": "Running", "llm-s0-w1": "Running"}
        assert lister.calls == 1
        assert not store.verify(NAMESPACE, JOB, server)  # llm-s0-w1: not on the server
        lister.pods = []
        assert phases(store, lister) == {} and lister.calls == 2
        assert asked == ["llm-s0-w0", "llm-s0-w1"]

    def test_a_late_deleted_event_of_an_earlier_pod_does_not_drop_its_successor(self) -> None:
        store = PodStore()
        store.observe("ADDED", pod("llm-s0-w0", uid="new"))
        store.observe("DELETED", pod("llm-s0-w0", uid="old"))
        assert phases(store, Lister([])) == {"llm-s0-w0": "Running"}


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
