"""The operator's own Prometheus metrics, scraped from its endpoint while it runs against the emulated
API server: TrainingJobs and pods by phase follow what the API server has, each pod replaced and each
scale event is counted once, every handler's time is observed, and every API request the operator
makes is counted by verb and resource exactly as the API server received it, retries included, with
the errors by HTTP status (an answer the operator takes as done, a 409 to a create, is none).
"""

from __future__ import annotations

import pytest
from slicekeeper.operator.metrics import HANDLERS

from tests.support.cluster_emulator import TRAININGJOBS
from tests.support.operator_example import NAMES, NS, example
from tests.support.operator_harness import emulated_cluster, eventually, operator
from tests.support.operator_metrics import (
    HOT_SWAPS,
    JOBS,
    PODS,
    SCALE_EVENTS,
    counted_as_in_status,
    leader_publishes,
    phases_agree,
    read,
    scrape,
    sent_by_operator,
    tally,
    uid_of,
)

pytestmark = pytest.mark.asyncio

REQUESTS, ERRORS = "slicekeeper_operator_api_requests_total", "slicekeeper_operator_api_errors_total"
HANDLER_CALLS = "slicekeeper_operator_reconcile_seconds_count"
PODS_PATH = f"/api/v1/namespaces/{NS}/pods"


async def test_jobs_and_pods_by_phase_replacements_scale_events_and_handler_times_follow_a_job():
    async with emulated_cluster() as kube, operator(kube):
        started = scrape(kube.metrics_url)
        assert tally(started, JOBS, "phase") == {} and tally(started, PODS, "phase") == {}
        handlers = {dict(labels)["handler"] for name, labels in started if name == HANDLER_CALLS}
        assert handlers == set(HANDLERS)  # every handler's series from the start

        await kube.apply(example())
        await phases_agree(kube, "Pending", {"Pending": 4})
        for name in NAMES:  # the scheduler: slice 0 on node tpu-a, slice 1 on tpu-b; the kubelet
            node = "tpu-a" if "-s0-" in name else "tpu-b"
            await kube.patch_pod(NS, name, {"spec": {"nodeName": node}, "status": {"phase": "Running"}})
        await phases_agree(kube, "Running", {"Running": 4})
        uids = {name: pod["metadata"]["uid"] for name, pod in kube.pods(NS).items()}

        not_ready = {"conditions": [{"type": "Ready", "status": "False"}]}
        await kube.put_node({"metadata": {"name": "tpu-b"}, "status": not_ready})  # slice 1's node lost
        await eventually(
            lambda: all(uid_of(kube, n) not in (None, uids[n]) for n in NAMES if "-s1-" in n),
            what="slice 1's pods replaced",
        )
        # Each replacement counted once, as the job's status counts them (the hot-swaps annotation).
        await eventually(
            lambda: counted_as_in_status(kube), what="the hot-swaps counted as the status has them"
        )
        swaps = tally(scrape(kube.metrics_url), HOT_SWAPS, "namespace")
        await phases_agree(kube, "Running", {"Running": 2, "Pending": 2})

        await leader_publishes(kube, step=10, slicesActive=1)  # the leader's policy dropped slice 1
        await eventually(
            lambda: tally(scrape(kube.metrics_url), SCALE_EVENTS, "namespace", "kind") == {(NS, "down"): 1},
            what="a scale-down counted",
        )
        await leader_publishes(kube, step=20, slicesActive=2)
        await eventually(
            lambda: tally(scrape(kube.metrics_url), SCALE_EVENTS, "kind") == {("down",): 1, ("up",): 1},
            what="the scale-up counted, the scale-down still once",
        )

        await kube.delete_job(NS, "tiny-lm")
        await eventually(
            lambda: (
                not kube.emulator.live(TRAININGJOBS, NS)
                and (samples := scrape(kube.metrics_url))
                and tally(samples, JOBS, "phase") == {}
                and tally(samples, PODS, "phase") == {}
            ),
            what="no job and no pod left in the metrics",
        )
        ended = scrape(kube.metrics_url)
        # Timer runs went on all along: nothing was counted again.
        assert tally(ended, SCALE_EVENTS, "kind") == {("down",): 1, ("up",): 1}
        assert tally(ended, HOT_SWAPS, "namespace") == swaps
        every_handler = {(handler,) for handler in HANDLERS}  # (`tally` leaves out what is 0)
        assert set(tally(ended, HANDLER_CALLS, "handler")) == every_handler
        assert set(tally(ended, "slicekeeper_operator_reconcile_seconds_sum", "handler")) == every_handler


async def test_every_api_request_is_counted_by_verb_as_the_api_server_received_it_with_errors_by_code():
    async with emulated_cluster() as kube:
        async with operator(kube) as first:
            await kube.apply(example())
            await eventually(lambda: sorted(kube.pods(NS)) == NAMES, what="4 pods")
            old_uid = kube.pods(NS)["tiny-lm-s1-w0"]["metadata"]["uid"]
            kube.emulator.refuse_once("POST", PODS_PATH, 500)  # the replacement's create, retried
            failed = {"spec": {"nodeName": "tpu-node-7"}, "status": {"phase": "Failed", "reason": "Evicted"}}
            await kube.patch_pod(NS, "tiny-lm-s1-w0", failed)
            await eventually(
                lambda: uid_of(kube, "tiny-lm-s1-w0") not in (None, old_uid), what="the failed pod replaced"
            )
            assert kube.emulator.refusals == []
        # The first operator has stopped: its figures are final, and so is what it sent.
        counted = read(first.metrics.registry)
        restart = len(kube.emulator._requests)
        requests = tally(counted, REQUESTS, "verb", "resource")
        assert requests == sent_by_operator(kube, 0, restart)
        assert tally(counted, ERRORS, "verb", "resource", "code") == {("create", "pods", "500"): 1}
        # Requests, not calls: the refused create and its retry are two requests and one write (a
        # count per call, or one that counted the retry twice, would miss this by one).
        writes = sum(count for (verb, _), count in requests.items() if verb in ("create", "patch", "delete"))
        assert writes == first.writes + 1

        async with operator(kube):  # a new process's counters: from 0
            await eventually(
                lambda: (
                    tally(scrape(kube.metrics_url), REQUESTS, "verb", "resource").get(("create", "secrets"))
                    == 1
                ),
                what="the resume handler's creates",
            )
            await kube.delete_job(NS, "tiny-lm")
            await eventually(lambda: not kube.emulator.live(TRAININGJOBS, NS), what="the job gone")
            samples = await eventually(
                lambda: (
                    (samples := scrape(kube.metrics_url))
                    and tally(samples, REQUESTS, "verb", "resource") == sent_by_operator(kube, restart)
                    and samples
                ),
                what="the restarted operator's requests counted as the API server received them",
            )
        requests = tally(samples, REQUESTS, "verb", "resource")
        # The resumed job's children were all there (409 each): answers, not errors; and so are the
        # 404s of deletes that the garbage collector got to first.
        assert {("create", kind) for kind in ("secrets", "services", "configmaps", "networkpolicies")} <= set(
            requests
        )
        assert requests[("list", "pods")] >= 2  # the resume's first read of the job, the deletion's
        assert tally(samples, ERRORS, "verb", "resource", "code") == {}
