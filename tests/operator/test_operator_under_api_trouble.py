"""The operator against an API server in trouble: a hot-swap and a scale-down still complete.

For a stretch of `STRETCH` seconds every request of the operator's (but its watches) waits 1 to 5 s,
then three in ten are answered 429 with `Retry-After: 1` and two in ten 500 (tests/support/
cluster_emulator.py, `Trouble`). Meanwhile a pod fails and the leader publishes that it scaled down.
Once the stretch is over: the pod is replaced once, with its host's history (hot-swap count, the node
avoided); the job's status says it runs on one slice; each event is posted once; the job has exactly
its hosts' pods. The operator kept its rules while refused: its requests during the stretch are
printed and bounded (its client's retries wait out each Retry-After and back off, so it never sent
more than a few requests a second).

The rules themselves, with a check that fails without them: through a stretch of 429s answered at
once, each retry of the operator's comes no sooner than the `Retry-After` second; the negative
control, a client without backoff that ignores Retry-After, retries within milliseconds and gives
up inside the stretch.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections import defaultdict
from typing import Any

import pytest
from kmock._internal import rendering
from slicekeeper.operator import loop_creates, rest_client
from slicekeeper.operator.cluster import USER_AGENT

from slicekeeper.api_rules import retry_rules
from tests.support.cluster_emulator import Trouble
from tests.support.operator_example import NAMES, NS, example
from tests.support.operator_harness import emulated_cluster, eventually, operator

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]

STRETCH = 12.0


async def test_a_hot_swap_and_a_scale_down_complete_through_a_stretch_of_429s_500s_and_latency():
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example())
        await eventually(lambda: sorted(kube.pods(NS)) == NAMES, what="the job's pods")
        for name in NAMES:
            await kube.patch_pod(NS, name, {"status": {"phase": "Running"}})
        await eventually(lambda: (kube.job(NS, "tiny-lm").get("status") or {}).get("slicesReady") == 2)
        victim = NAMES[2]
        old = kube.pods(NS)[victim]["metadata"]["uid"]

        trouble = Trouble(until=time.monotonic() + STRETCH)
        kube.emulator.trouble = trouble
        await kube.patch_pod(
            NS,
            victim,
            {"spec": {"nodeName": "tpu-node-7"}, "status": {"phase": "Failed", "reason": "Evicted"}},
        )
        view = json.dumps({"state": "running", "slicesActive": 1})
        await kube.patch_pod(NS, NAMES[0], {"metadata": {"annotations": {"slicekeeper.dev/status": view}}})

        def done() -> dict[str, Any] | None:
            status = kube.job(NS, "tiny-lm").get("status") or {}
            pod = kube.pods(NS).get(victim)
            replaced = pod is not None and pod["metadata"]["uid"] != old
            return (
                replaced
                and status.get("slicesActive") == 1
                and not status.get("replacing")
                and status.get("restarts", {}).get("replace") == 1
                and pod
            )

        fresh = await eventually(done, timeout=STRETCH + 60, what="the hot-swap and the scale-down")
        refused = sum(1 for *_, status in trouble.requests if status)
        print(f"troubled requests: {len(trouble.requests)}, refused {refused}")
        assert trouble.requests, "the operator made no request during the stretch"
        assert refused, "no request was refused"
        assert fresh["metadata"]["annotations"]["slicekeeper.dev/hot-swaps"] == "1"
        assert fresh["metadata"]["annotations"]["slicekeeper.dev/avoid-nodes"] == "tpu-node-7"
        assert sorted(kube.pods(NS)) == NAMES  # no duplicate, no other pod
        reasons = [e["reason"] for e in kube.events(NS)]
        assert reasons.count("HotSwap") == 1 and reasons.count("ScaleDown") == 1, reasons
        # Bounded: each request of the stretch waited 1-5 s first, and a refusal was retried only
        # after its Retry-After or backoff, so the operator's threads sent a few a second at most.
        times = sorted(t for t, *_ in trouble.requests)
        busiest = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
        print(f"at most {busiest} troubled requests answered in one second")
        assert busiest <= 20


FAST_STRETCH = 3.0


def throttled_stretch() -> Trouble:
    """`FAST_STRETCH` seconds, from the first troubled request on, of every troubled request answered
    429, `Retry-After: 1`. From the first request, not from now: on a loaded machine the operator
    once sent its first create after a stretch counted from the job's apply had ended."""
    return Trouble(
        until=math.inf, lasts=FAST_STRETCH, latency=(0.0, 0.0), throttled=1.0, failed=0.0, retry_after=1
    )


async def through_the_stretch(trouble: Trouble) -> None:
    """Wait for the stretch's first troubled request, then for the stretch to end."""
    await eventually(lambda: trouble.requests, what="the stretch's first troubled request")
    await asyncio.sleep(FAST_STRETCH)


def retry_gaps(trouble: Trouble) -> list[float]:
    """The seconds between consecutive refused requests of the same method and path."""
    calls: dict[tuple[str, str], list[float]] = defaultdict(list)
    for at, method, path, _ in trouble.requests:
        calls[method, path].append(at)
    return [later - earlier for times in calls.values() for earlier, later in itertools.pairwise(times)]


def the_operators_requests(request: rendering.Request) -> bool:
    """The operator's own client's requests (not kopf's, not its watches)."""
    watch = request.params.get("watch") in ("true", "1")
    return str(request.headers.get("User-Agent", "")).startswith(USER_AGENT) and not watch


def without_backoff(**kwargs: Any) -> dict[str, Any]:
    return {
        **retry_rules(**kwargs),
        "backoff_factor": 0,
        "backoff_jitter": 0,
        "respect_retry_after_header": False,
    }


@pytest.mark.parametrize("rules", ["kept", "negative control: no backoff, Retry-After ignored"])
async def test_each_retry_of_a_refused_request_waits_out_its_retry_after(rules, monkeypatch):
    if rules != "kept":
        monkeypatch.setattr(rest_client, "retry_rules", without_backoff)
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example())
        await eventually(lambda: sorted(kube.pods(NS)) == NAMES, what="the job's pods")
        victim = NAMES[2]
        old = kube.pods(NS)[victim]["metadata"]["uid"]
        trouble = throttled_stretch()
        trouble.affects = the_operators_requests
        kube.emulator.trouble = trouble
        await kube.patch_pod(NS, victim, {"status": {"phase": "Failed", "reason": "Evicted"}})
        await through_the_stretch(trouble)
        gaps = retry_gaps(trouble)
        print(f"{rules}: {len(trouble.requests)} refused, retried after {[round(g, 3) for g in gaps]} s")
        assert gaps, "no refused request was tried again"
        if rules == "kept":
            assert min(gaps) >= 0.95  # Retry-After: 1
            await eventually(
                lambda: (pod := kube.pods(NS).get(victim)) and pod["metadata"]["uid"] != old,
                what="the hot-swap, once the stretch is over",
            )
        else:
            assert min(gaps) < 0.5


def pod_creates(request: rendering.Request) -> bool:
    return (
        the_operators_requests(request)
        and request.method.value == "POST"
        and request.url.path.endswith("/pods")
    )


@pytest.mark.parametrize("rules", ["kept", "negative control: no backoff, Retry-After ignored"])
async def test_a_jobs_pods_created_from_the_event_loop_wait_out_each_retry_after(rules, monkeypatch):
    """The creates of a job's pods (operator/loop_creates.py, not the client's threads) keep the same
    rules: through a stretch of 429s each retry comes after its Retry-After, and every pod is made
    once; without the rules a create is retried within milliseconds (and spent inside the stretch).
    One create in flight, so the refused requests to the pods' collection are the retries of one."""
    if rules != "kept":
        monkeypatch.setattr(loop_creates, "retry_rules", without_backoff)
    async with emulated_cluster() as kube, operator(kube, concurrency=1):  # one create at a time
        trouble = throttled_stretch()
        trouble.affects = pod_creates
        kube.emulator.trouble = trouble
        await kube.apply(example())
        await through_the_stretch(trouble)
        gaps = retry_gaps(trouble)
        print(
            f"{rules}: {len(trouble.requests)} creates refused, retried after {[round(g, 3) for g in gaps]} s"
        )
        assert gaps, "no refused create was tried again"
        if rules == "kept":
            assert min(gaps) >= 0.95  # Retry-After: 1
            await eventually(lambda: sorted(kube.pods(NS)) == NAMES, what="the job's pods, after the stretch")
        else:
            assert min(gaps) < 0.5
