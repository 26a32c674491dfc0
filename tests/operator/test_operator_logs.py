"""The operator's log at a job's scale (operator/log_summary.py): no line per pod event at INFO, one
summary line for the job instead; with the filter off (the negative control) kopf says a line for
every event of every pod."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from slicekeeper.operator.log_summary import KOPF_OBJECTS_LOGGER, quiet_routine

from tests.support.operator_example import EXAMPLE, NS, example
from tests.support.operator_harness import emulated_cluster, eventually, operator

pytestmark = pytest.mark.asyncio
SLICES = 8
PODS = 2 * SLICES
POD_EVENT_SUCCEEDED = "pod_event' succeeded."
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
    assert not [r for r in records if POD_EVENT_SUCCEEDED in r.getMessage()]
    [first, *_] = [r.getMessage() for r in records if r.getMessage().startswith(SUMMARY)]
    assert "pod events" in first and "children created" in first


async def test_negative_control_without_the_filter_every_pod_event_is_a_line(caplog):
    records = await logged_while_created(caplog)
    assert len([r for r in records if POD_EVENT_SUCCEEDED in r.getMessage()]) >= PODS
