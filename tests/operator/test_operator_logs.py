"""The operator at a job's scale, seen from outside: its log (operator/log_summary.py) has no line per
pod event, node event or timer run at INFO, one summary line for the job instead (with the filter
off, the negative control, kopf says a line for every run of the job's timer); and it asks the API
server for the jobs' pods only."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from slicekeeper.operator.log_summary import KOPF_OBJECTS_LOGGER, quiet_routine
from slicekeeper.operator.render import LABEL_JOB

from tests.support.operator_example import EXAMPLE, NS, example
from tests.support.operator_harness import emulated_cluster, eventually, operator

pytestmark = pytest.mark.asyncio
SLICES = 8
PODS = 2 * SLICES
TIMER_SUCCEEDED = "keep' succeeded."
SUMMARY = f"job {NS}/{EXAMPLE['metadata']['name']}: "


@pytest.fixture
def quiet() -> Iterator[None]:
    routine = quiet_routine(logging.INFO)
    yield
    logging.getLogger(KOPF_OBJECTS_LOGGER).removeFilter(routine)


async def logged_while_created(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    caplog.set_level(logging.INFO)
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example(slices=SLICES))
        await eventually(lambda: len(kube.pods(NS)) == PODS, what=f"{PODS} pods", timeout=60)
        await eventually(
            lambda: any(r.getMessage().startswith(SUMMARY) for r in caplog.records),
            what="the job's summary line",
        )
    return list(caplog.records)


async def test_a_job_of_many_pods_is_one_summary_line_not_a_line_per_pod(caplog, quiet):
    records = await logged_while_created(caplog)
    assert not [r for r in records if TIMER_SUCCEEDED in r.getMessage()]
    [first, *_] = [r.getMessage() for r in records if r.getMessage().startswith(SUMMARY)]
    assert "pod events" in first and "children created" in first


async def test_negative_control_without_the_filter_every_timer_run_is_a_line(caplog):
    records = await logged_while_created(caplog)
    assert len([r for r in records if TIMER_SUCCEEDED in r.getMessage()]) >= 2


async def test_the_operator_lists_and_watches_only_the_jobs_pods():
    """The operator's pod informer asks the API server for the jobs' pods alone, so a cluster's other
    pods (tens of thousands, at the scale the operator serves) never reach it."""
    async with emulated_cluster() as kube:
        other = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-0", "namespace": NS}}
        other["spec"] = {"containers": [{"name": "web", "image": "nginx"}]}
        await kube.request("POST", f"/api/v1/namespaces/{NS}/pods", other)
        async with operator(kube):
            await kube.apply(example())
            await eventually(lambda: len(kube.pods(NS)) == 5, what="the job's 4 pods beside web-0")
            pods = [r for r in kube.emulator._requests if r.method == "GET" and r.url.path.endswith("/pods")]
            selectors = {r.url.query.get("labelSelector") for r in pods}
            # the informer's list and watch (the label's presence); kopf lists and watches no pods:
            assert selectors == {LABEL_JOB}, [str(r.url) for r in pods]
            assert {r.url.query.get("watch") for r in pods} == {None, "true"}
