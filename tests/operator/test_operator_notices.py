"""Announced losses, against the emulated API server: a node that GKE labels with a scheduled maintenance
time, or taints for an impending termination, has the notice annotation put on the job pods bound to it
(and on no other pod), once; a node that stops saying so has it taken off again; a node with other
labels and taints gets nothing."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from slicekeeper.operator.pod_store import PodStore

from slicekeeper import protocol
from tests.support.operator_example import NAMES, NS, example
from tests.support.operator_harness import Kube, emulated_cluster, eventually, operator

pytestmark = pytest.mark.asyncio

MAINTENANCE_LABEL = "cloud.google.com/scheduled-maintenance-time"
TERMINATION_TAINT = {"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}
TPU_TAINT = {"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}
SETTLE_SECONDS = 2.0
"""Long enough for several runs of the jobs' timers (every 0.5 s in these tests) and the node events."""


async def place_slices(kube: Kube) -> None:
    """Ready nodes tpu-a and tpu-b; play the scheduler: slice 0 on tpu-a, slice 1 on tpu-b, Running."""
    for name in ("tpu-a", "tpu-b"):
        ready = {"conditions": [{"type": "Ready", "status": "True"}]}
        await kube.put_node({"metadata": {"name": name}, "spec": {"taints": [TPU_TAINT]}, "status": ready})
    for name in NAMES:
        node = "tpu-a" if "-s0-" in name else "tpu-b"
        await kube.patch_pod(NS, name, {"spec": {"nodeName": node}, "status": {"phase": "Running"}})


def notices(kube: Kube) -> dict[str, dict[str, Any]]:
    """The notice on each job pod that has one, read as JSON."""
    return {
        name: json.loads(pod["metadata"]["annotations"][protocol.ANNOTATION_NOTICE])
        for name, pod in kube.pods(NS).items()
        if protocol.ANNOTATION_NOTICE in (pod["metadata"].get("annotations") or {})
    }


def pod_writes(kube: Kube) -> int:
    return sum(1 for resource, _ in kube.writes() if resource == "pods")


async def test_a_scheduled_maintenance_reaches_the_pods_on_that_node_alone_and_goes_when_the_label_does():
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example())
        await eventually(lambda: len(kube.pods(NS)) == 4, what="4 pods")
        await place_slices(kube)
        # Negative control first: labels and a cordon that announce no loss.
        unrelated = {"cloud.google.com/gke-nodepool": "pool-a", "team": "research"}
        await kube.put_node(
            {"metadata": {"name": "tpu-a", "labels": unrelated}, "spec": {"unschedulable": True}}
        )
        await kube.put_node({"metadata": {"name": "tpu-b", "labels": {MAINTENANCE_LABEL: "1767225600"}}})
        held = await eventually(lambda: len(notices(kube)) == 2 and notices(kube), what="slice 1's notices")
        assert held == {
            name: {
                "kind": "maintenance",
                "at": 1767225600,
                "source": f"label {MAINTENANCE_LABEL}=1767225600",
            }
            for name in NAMES
            if "-s1-" in name
        }
        # Written once: neither the timers nor another event of the node (same label, a new one) write again.
        written = pod_writes(kube)
        await kube.put_node({"metadata": {"name": "tpu-b", "labels": {"checked": "yes"}}})
        await asyncio.sleep(SETTLE_SECONDS)
        assert sorted(notices(kube)) == [n for n in NAMES if "-s1-" in n]  # still none on tpu-a's pods
        assert pod_writes(kube) == written
        # The maintenance rescheduled away: the label goes, and so do the notices.
        await kube.put_node({"metadata": {"name": "tpu-b", "labels": {MAINTENANCE_LABEL: None}}})
        await eventually(lambda: notices(kube) == {}, what="the notices withdrawn")


async def test_an_impending_termination_is_a_preemption_due_when_the_pods_grace_runs_out():
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example(disruption={"terminationGracePeriodSeconds": 120}))
        await eventually(lambda: len(kube.pods(NS)) == 4, what="4 pods")
        await place_slices(kube)
        before = time.time()
        await kube.put_node(
            {"metadata": {"name": "tpu-a"}, "spec": {"taints": [TPU_TAINT, TERMINATION_TAINT]}}
        )
        held = await eventually(lambda: len(notices(kube)) == 2 and notices(kube), what="slice 0's notices")
        after = time.time()
        assert sorted(held) == [n for n in NAMES if "-s0-" in n]
        for notice in held.values():
            assert notice["kind"] == "preemption"
            assert notice["source"] == "taint cloud.google.com/impending-node-termination:NoSchedule"
            assert int(before) + 120 <= notice["at"] <= after + 120  # now + the pod's own grace
        written = pod_writes(kube)
        await asyncio.sleep(SETTLE_SECONDS)  # time passes: the notice's `at` is not moved on
        assert pod_writes(kube) == written and notices(kube) == held


@pytest.mark.parametrize("status_interval", [0.5, 3600.0], ids=["timer-twice-a-second", "timer-hourly"])
async def test_a_host_event_on_one_vm_of_a_slice_reaches_every_pod_of_that_slice(status_interval: float):
    """GKE: a host event on one VM of a multi-host TPU slice interrupts the whole slice. Slice 1's two
    pods on two nodes, one labelled: both get the notice, slice 0 none. With the node's event itself,
    not the job timer's next look (hourly here): left to the timer, on a loaded machine the announcing
    host was retired and its pod re-created elsewhere first, its slice then announcing nothing, and
    host 2 was never told (the operator's maintenance test). Negative control: the operator before
    this test gave the event's notice to the node's pods alone; `timer-hourly` failed there."""
    async with emulated_cluster() as kube, operator(kube, status_interval=status_interval):
        await kube.apply(example())
        await eventually(lambda: len(kube.pods(NS)) == 4, what="4 pods")
        ready = {"conditions": [{"type": "Ready", "status": "True"}]}
        for name in ("tpu-a", "tpu-b", "tpu-c"):
            await kube.put_node(
                {"metadata": {"name": name}, "spec": {"taints": [TPU_TAINT]}, "status": ready}
            )
        for name in NAMES:
            node = "tpu-a" if "-s0-" in name else ("tpu-b" if name.endswith("-w0") else "tpu-c")
            await kube.patch_pod(NS, name, {"spec": {"nodeName": node}, "status": {"phase": "Running"}})
        await asyncio.sleep(SETTLE_SECONDS)  # the bindings seen
        await kube.put_node({"metadata": {"name": "tpu-c", "labels": {MAINTENANCE_LABEL: "1767225600"}}})
        held = await eventually(
            lambda: len(notices(kube)) == 2 and notices(kube), what="slice 1's notices", timeout=10
        )
        assert sorted(held) == [n for n in NAMES if "-s1-" in n]
        await asyncio.sleep(SETTLE_SECONDS)
        assert sorted(notices(kube)) == [n for n in NAMES if "-s1-" in n]  # none on slice 0's pods


async def test_a_notice_is_written_once_though_the_operators_pod_watch_lags_behind_its_own_writes(
    monkeypatch: pytest.MonkeyPatch,
):
    """The operator decides from its own pod store, which hears of the operator's own writes only
    through its watch. Here every pod event with a notice reaches the store 1 s late (as under a
    loaded machine or API server): the jobs' timers (every 0.5 s) and the node's events meanwhile see
    no notice on the pods, and must not write it again."""
    observe = PodStore.observe

    def late(store: PodStore, event_type: str, pod: dict[str, Any]) -> None:
        time.sleep(1.0 if protocol.ANNOTATION_NOTICE in (pod["metadata"].get("annotations") or {}) else 0)
        observe(store, event_type, pod)

    monkeypatch.setattr(PodStore, "observe", late)
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example())
        await eventually(lambda: len(kube.pods(NS)) == 4, what="4 pods")
        await place_slices(kube)
        written = pod_writes(kube)
        await kube.put_node({"metadata": {"name": "tpu-b", "labels": {MAINTENANCE_LABEL: "1767225600"}}})
        await eventually(lambda: len(notices(kube)) == 2, what="slice 1's notices")
        await kube.put_node({"metadata": {"name": "tpu-b", "labels": {"checked": "yes"}}})
        await asyncio.sleep(SETTLE_SECONDS + 2.0)
        assert pod_writes(kube) - written == 2  # one notice on each of slice 1's pods
        await kube.put_node({"metadata": {"name": "tpu-b", "labels": {MAINTENANCE_LABEL: None}}})
        await eventually(lambda: notices(kube) == {}, what="the notices withdrawn")
        await asyncio.sleep(SETTLE_SECONDS + 2.0)
        assert pod_writes(kube) - written == 4  # and one withdrawal of each
