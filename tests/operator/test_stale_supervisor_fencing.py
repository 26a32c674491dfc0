"""A supervisor whose pod was replaced while it lived on cannot write its successor's pod.

A node cut off from the API server goes NotReady; the operator deletes its pods and creates their
replacements elsewhere, under the same names, while the old supervisors run on where the kubelet
cannot stop them. Every write a supervisor makes to its own pod (the leader's status, a request to be
replaced) carries the pod's uid (`POD_UID`, from the downward API): against a pod of the same name
made since, the API server answers 409 (its store's uid precondition, which the emulator keeps too)
and nothing is written. Negative control: the same write without the uid lands on the successor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from slicekeeper.supervisor.pod import own_pod

from slicekeeper import protocol
from tests.support.operator_harness import Kube, emulated_cluster
from tests.support.supervisor_client import point_supervisor_client

pytestmark = pytest.mark.asyncio

NS = "research"
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "tiny-lm-s1-w0", "namespace": NS},
    "spec": {"containers": [{"name": "supervisor", "image": "slicekeeper"}]},
}


@pytest.fixture
def pod_client_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Points the supervisor's client at an emulated API server, as a pod's is."""
    return lambda url: point_supervisor_client(url, tmp_path, monkeypatch)


async def create_pod(kube: Kube) -> dict[str, Any]:
    return await kube.request("POST", f"/api/v1/namespaces/{NS}/pods", POD)


async def test_the_replaced_pods_supervisor_cannot_annotate_its_successor(pod_client_for):
    async with emulated_cluster() as kube:
        pod_client_for(kube.url)
        first = await create_pod(kube)
        env = {
            protocol.ENV_POD_NAME: POD["metadata"]["name"],
            protocol.ENV_POD_NAMESPACE: NS,
            protocol.ENV_POD_UID: first["metadata"]["uid"],
        }
        stale = own_pod.OwnPod.from_env(env)
        assert stale is not None and stale.uid == first["metadata"]["uid"]
        assert await asyncio.to_thread(stale.publish_status, {"state": "running", "step": 40}) is None
        await kube.delete_pod(NS, POD["metadata"]["name"])
        successor = await create_pod(kube)  # the operator's replacement, same name
        assert successor["metadata"]["uid"] != first["metadata"]["uid"]

        refused = await asyncio.to_thread(stale.ask_replacement, "a straggler, said too late")
        assert refused is not None and "409" in refused and "Precondition failed" in refused
        annotations = kube.pods(NS)[POD["metadata"]["name"]]["metadata"].get("annotations") or {}
        assert protocol.ANNOTATION_REPLACE not in annotations

        # Negative control: without the uid the stale supervisor's request lands on the new pod.
        unfenced = own_pod.OwnPod(NS, POD["metadata"]["name"])
        assert await asyncio.to_thread(unfenced.ask_replacement, "a straggler, said too late") is None
        annotations = kube.pods(NS)[POD["metadata"]["name"]]["metadata"]["annotations"]
        assert annotations[protocol.ANNOTATION_REPLACE] == "a straggler, said too late"
