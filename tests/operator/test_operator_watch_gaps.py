"""The operator across the gaps of its watches: a real API server ends watches, and answers a watch
that comes back with a resourceVersion it no longer holds with 410 Gone; kopf then lists again, and
an object deleted meanwhile is simply absent from that listing (no DELETED event ever comes). The
operator must still see the deletion and act on it.

The gap here is `ClusterEmulator.watch_gap`: the watches are cut off, something happens, the history
is compacted, and kopf's watch comes back to 410 and a fresh listing.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.operator_example import NAMES, NS, example
from tests.support.operator_harness import Kube, emulated_cluster, eventually, operator

pytestmark = pytest.mark.asyncio


async def running_and_seen(kube: Kube) -> dict[str, str]:
    """Bind every pod and make it Running; wait until the operator's status counts every slice
    ready (proof that its pod watch delivered each pod's change). The pods' uids."""
    await eventually(lambda: sorted(kube.pods(NS)) == NAMES, what="4 pods")
    for name in NAMES:
        await kube.patch_pod(NS, name, {"spec": {"nodeName": f"node-{name}"}, "status": {"phase": "Running"}})
    await eventually(
        lambda: kube.job(NS, "tiny-lm").get("status", {}).get("slicesReady") == 2, what="both slices ready"
    )
    return {name: pod["metadata"]["uid"] for name, pod in kube.pods(NS).items()}


def recreated(kube: Kube, uids: dict[str, str], name: str) -> dict[str, Any] | None:
    pod = kube.pods(NS).get(name)
    return pod if pod is not None and pod["metadata"]["uid"] != uids[name] else None


async def test_a_pod_deleted_while_the_pod_watch_was_cut_off_is_created_again():
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example())
        uids = await running_and_seen(kube)
        async with kube.emulator.watch_gap("v1/pods"):
            await kube.delete_pod(NS, "tiny-lm-s1-w1")
        await eventually(lambda: recreated(kube, uids, "tiny-lm-s1-w1"), what="tiny-lm-s1-w1 created again")
        assert {n: p["metadata"]["uid"] for n, p in kube.pods(NS).items() if n != "tiny-lm-s1-w1"} == {
            n: u for n, u in uids.items() if n != "tiny-lm-s1-w1"
        }  # the others untouched


async def test_every_pod_of_the_job_deleted_while_the_pod_watch_was_cut_off_is_created_again():
    """No pod of the job is left to show up in kopf's new listing: the operator must notice the
    re-list all the same."""
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example())
        uids = await running_and_seen(kube)
        async with kube.emulator.watch_gap("v1/pods"):
            for name in NAMES:
                await kube.delete_pod(NS, name)
        await eventually(
            lambda: all(recreated(kube, uids, name) for name in NAMES), what="the 4 pods created again"
        )


async def test_a_job_suspended_while_the_job_watch_was_cut_off_is_suspended_after_the_re_list():
    """kopf compares a re-listed job with the spec it last handled (its annotation), so a change made
    during the gap reaches the update handler all the same."""
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example())
        await running_and_seen(kube)
        async with kube.emulator.watch_gap("slicekeeper.dev/v1alpha1/trainingjobs"):
            await kube.patch_job(NS, "tiny-lm", {"spec": {"suspend": True}})
        await eventually(
            lambda: not kube.pods(NS) and kube.job(NS, "tiny-lm")["status"].get("phase") == "Suspended",
            what="no pods, phase Suspended",
        )
