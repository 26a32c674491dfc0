"""The fake kubelet (tests/support/fake_kubelet.py) fails the test that meets a bug in it, at once and
with the bug's traceback, and rides out what a restarting API server does to it, as a kubelet does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_kubelet import FakeTpuCluster
from tests.support.operator_example import NS
from tests.support.operator_harness import emulated_cluster, eventually

pytestmark = pytest.mark.asyncio


def bare_pod(name: str) -> dict[str, Any]:
    """A job pod as the scheduler sees one (its job and slice labels), running `true`."""
    labels = {"slicekeeper.dev/job": "j", "slicekeeper.dev/slice": "0"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "i", "command": ["true"]}]},
    }


async def test_a_bug_in_the_fake_kubelet_fails_the_test_at_once_with_its_traceback(tmp_path: Path):
    async with emulated_cluster(watch_seconds=None) as kube, FakeTpuCluster(kube, tmp_path, {}) as cluster:

        async def broken_start(pod: dict[str, Any], pods: list[dict[str, Any]]) -> None:
            raise RuntimeError(f"kubelet bug starting {pod['metadata']['name']}")

        cluster._start = broken_start  # type: ignore[method-assign]
        await cluster.add_node("n-0", "pool-a")
        await kube.request("POST", f"/api/v1/namespaces/{NS}/pods", bare_pod("p"))
        with pytest.raises(RuntimeError, match="kubelet bug starting p") as raised:
            await eventually(lambda: False, timeout=60, what="never: the kubelet's bug ends the wait")
        assert any(entry.name == "broken_start" for entry in raised.traceback)
        kube.failures.clear()  # seen: the cluster may end cleanly


async def test_an_api_server_restarting_for_a_while_is_ridden_out(tmp_path: Path):
    async with emulated_cluster(watch_seconds=None) as kube, FakeTpuCluster(kube, tmp_path, {}) as cluster:
        await cluster.add_node("n-0", "pool-a")
        await kube.request("POST", f"/api/v1/namespaces/{NS}/pods", bare_pod("p"))
        kube.emulator.unavailable = True  # every request answered 503: the pod's binding too
        refused = len(kube.emulator._requests)
        await eventually(lambda: len(kube.emulator._requests) > refused + 3, what="the kubelet retrying")
        kube.emulator.unavailable = False
        done = await eventually(
            lambda: kube.pods(NS)["p"]["status"].get("phase") == "Succeeded" and kube.pods(NS)["p"],
            what="the pod run to its end after the outage",
        )
        assert done["spec"]["nodeName"] == "n-0"
