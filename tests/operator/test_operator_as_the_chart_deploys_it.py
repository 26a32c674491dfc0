"""The operator as the chart deploys it: started with the command, arguments and environment of the
Deployment the Helm engine renders (tests/support/operator_process.py), against the emulated API
server, and scraped by a real Prometheus as the chart's operator PodMonitor has it scraped (its scrape
job `<namespace>/slicekeeper-operator`, the pod's namespace and name), evaluating the chart's rules.

Through one job's life (created, scheduled, a node lost and its pods replaced, the leader's policy
scaling down and back up): the operator answers the liveness probe on the Deployment's port, serves
its metrics on the port named `metrics`, logs at the chart's log level, and every query of the
Operator dashboard returns series from it; the operator-down alert stays silent while it runs and goes
pending once it stopped (SIGTERM, exit 0).

It watches every namespace (the chart's default): with `operator.watchNamespaces` set, kopf lists and
watches Namespace objects, which kmock's emulator cannot serve (it parses `/api/v1/namespaces` as a
namespace prefix). That the chart's arguments for it are ones the operator takes is checked in
tests/unit/test_operator_deployment.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from slicekeeper.supervisor.ports import free_port

from tests.support import chart
from tests.support.dashboards import committed, panel_queries
from tests.support.operator_example import NAMES, NS, example
from tests.support.operator_harness import Kube, emulated_cluster, eventually
from tests.support.operator_metrics import (
    JOBS,
    SCALE_EVENTS,
    counted_as_in_status,
    leader_publishes,
    phases_agree,
    scrape,
    tally,
    uid_of,
)
from tests.support.operator_process import OPERATOR_DEPLOYMENT, operator_as_deployed
from tests.support.prometheus import alert, write_rule_file
from tests.support.prometheus_server import Prometheus, running_prometheus

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]

OPERATOR_DOWN = "SlicekeeperOperatorDown"


def chart_values() -> dict[str, Any]:
    return {
        "operator": {
            "livenessPort": free_port(),
            "metricsPort": free_port(),
            "logLevel": "debug",
            "extraEnv": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        }
    }


def scrape_target(where: Path, metrics_port: int) -> str:
    """A file_sd entry with the labels the chart's operator PodMonitor gives its target."""
    path = where / "operator-target.json"
    labels = {
        "job": f"{chart.NAMESPACE}/{OPERATOR_DEPLOYMENT}",
        "namespace": chart.NAMESPACE,
        "pod": f"{OPERATOR_DEPLOYMENT}-7d9c8b6f5-x2x4q",
    }
    path.write_text(json.dumps([{"targets": [f"127.0.0.1:{metrics_port}"], "labels": labels}]))
    return str(path)


async def wait_for_query(prometheus: Prometheus, expr: str, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := await asyncio.to_thread(prometheus.query, expr)):
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what} ({expr})"
        await asyncio.sleep(0.5)
    return result


async def a_job_lives_its_life(kube: Kube) -> None:
    """The example job created, scheduled and running; slice 1's node lost and its pods replaced (the
    API server failing one create, which the operator retries: the errors panel has a series); the
    leader's policy scales down, then back up."""
    await kube.apply(example())
    await phases_agree(kube, "Pending", {"Pending": 4})
    for name in NAMES:
        node = "tpu-a" if "-s0-" in name else "tpu-b"
        await kube.patch_pod(NS, name, {"spec": {"nodeName": node}, "status": {"phase": "Running"}})
    await phases_agree(kube, "Running", {"Running": 4})
    uids = {name: pod["metadata"]["uid"] for name, pod in kube.pods(NS).items()}
    kube.emulator.refuse_once("POST", f"/api/v1/namespaces/{NS}/pods", 500)  # a replacement's, retried
    await kube.put_node(
        {"metadata": {"name": "tpu-b"}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    )
    await eventually(
        lambda: all(uid_of(kube, n) not in (None, uids[n]) for n in NAMES if "-s1-" in n),
        what="slice 1's pods replaced",
    )
    await eventually(lambda: counted_as_in_status(kube), what="the hot-swaps counted")
    await leader_publishes(kube, step=10, slicesActive=1)
    await eventually(
        lambda: tally(scrape(kube.metrics_url), SCALE_EVENTS, "kind") == {("down",): 1}, what="the scale-down"
    )
    await leader_publishes(kube, step=20, slicesActive=2)
    await eventually(
        lambda: tally(scrape(kube.metrics_url), SCALE_EVENTS, "kind") == {("down",): 1, ("up",): 1},
        what="the scale-up",
    )


async def test_the_operator_started_as_the_chart_deploys_it_runs_a_job_is_scraped_and_alerted_on(tmp_path):
    values = chart_values()
    rules = write_rule_file(tmp_path / "rules.yaml", values)
    down = alert(OPERATOR_DOWN, values)["expr"]
    async with emulated_cluster() as kube, operator_as_deployed(kube.url, values, tmp_path) as operator:
        probe = operator.container["livenessProbe"]["httpGet"]
        liveness = f"http://127.0.0.1:{operator.port(probe['port'])}{probe['path']}"
        metrics = operator.port("metrics")
        kube.metrics_url = f"http://127.0.0.1:{metrics}/metrics"
        with running_prometheus(tmp_path, [scrape_target(tmp_path, metrics)], [rules]) as prometheus:
            up = f'up{{job="{chart.NAMESPACE}/{OPERATOR_DEPLOYMENT}"}} == 1'
            await wait_for_query(prometheus, up, "Prometheus scraping the operator's metrics port")

            await a_job_lives_its_life(kube)

            # The Deployment's liveness probe, where it asks.
            async with aiohttp.ClientSession() as session, session.get(liveness) as response:
                assert response.status == 200, await response.text()

            await asyncio.sleep(3.0)  # a few more scrapes of the job's life
            assert await asyncio.to_thread(prometheus.query, down) == [], "operator-down while it runs"
            queries = [
                query.filled({}, rate_interval="1m", range_="5m")
                for query in panel_queries("operator", committed()["operator"])
            ]
            empty = [expr for expr in queries if not await asyncio.to_thread(prometheus.query, expr)]
            assert empty == [], f"Operator dashboard queries without series: {empty}"
            assert tally(scrape(kube.metrics_url), JOBS, "namespace") == {(NS,): 1}

            code = await operator.stop()
            assert code == 0, f"exit {code} on SIGTERM:\n{operator.tail()}"
            await wait_for_query(prometheus, down, "the operator-down expression once it stopped")
            pending = f'ALERTS{{alertname="{OPERATOR_DOWN}", alertstate="pending"}}'
            await wait_for_query(prometheus, pending, "the operator-down alert pending")
    log = operator.log.read_text()
    assert " DEBUG " in log, f"the chart's logLevel debug did not reach the operator:\n{log[-2000:]}"
