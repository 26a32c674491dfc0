"""Two operator replicas (operator/leader_election.py), each started as the chart's Deployment starts
it (tests/support/operator_process.py), against the emulated API server: only the holder of the
Lease `slicekeeper-operator` acts, the standby answers its liveness probe while it waits, and once
the acting one is killed the standby takes the Lease within its duration and serves the job (a pod
deleted is replaced). Negative control: two replicas without leader election both work on the job
(each one's log has the job's summary line)."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from slicekeeper.operator.leader_election import LEASE_NAME
from slicekeeper.supervisor.ports import free_port

from tests.support import chart
from tests.support.operator_example import NAMES, NS, example
from tests.support.operator_harness import Kube, emulated_cluster, eventually
from tests.support.operator_process import OperatorProcess, operator_as_deployed

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240)]

LEASE_SECONDS = 3
SUMMARY_SECONDS = 5.0
"""A job's timer runs every 5 s (operator/handlers.py STATUS_INTERVAL_SECONDS) and says its first
summary line at its first run after the operator did something for the job."""
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{chart.NAMESPACE}/leases/{LEASE_NAME}"


def replica_values(*, election: bool) -> dict[str, Any]:
    """The chart's values for one replica process: ports of its own (two share this machine)."""
    return {
        "operator": {
            "replicas": 2 if election else 1,
            "leaderElection": {"enabled": election, "leaseSeconds": LEASE_SECONDS},
            "livenessPort": free_port(),
            "metricsPort": free_port(),
            "extraEnv": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        }
    }


def holder_of(replica: OperatorProcess) -> str:
    """The replica's identity in the Lease: no POD_NAME outside a pod, so its host and pid."""
    return f"{socket.gethostname()}-{replica.process.pid}"


async def lease_holder(kube: Kube) -> str | None:
    try:
        lease = await kube.request("GET", LEASE_PATH)
    except AssertionError:  # (no Lease yet: 404)
        return None
    return str(lease["spec"].get("holderIdentity") or "") or None


async def answers_liveness(replica: OperatorProcess) -> bool:
    url = f"http://127.0.0.1:{replica.port('healthz')}/healthz"
    try:
        async with aiohttp.ClientSession() as session, session.get(url) as answer:
            return answer.status == 200
    except aiohttp.ClientError:
        return False


async def test_one_replica_acts_and_the_standby_takes_over_when_it_is_killed(tmp_path: Path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    async with (
        emulated_cluster() as kube,
        operator_as_deployed(kube.url, replica_values(election=True), tmp_path / "a") as first,
    ):
        await eventually(lambda: first.log.read_text().count("holds the Lease") == 1, what="A leads")
        assert await lease_holder(kube) == holder_of(first)
        async with operator_as_deployed(kube.url, replica_values(election=True), tmp_path / "b") as second:
            await eventually(lambda: "waiting for the Lease" in second.log.read_text(), what="B stands by")
            assert await answers_liveness(second)  # a standby is alive: the kubelet keeps it
            await kube.apply(example())
            await eventually(lambda: sorted(kube.pods(NS)) == NAMES, what="the job's pods", timeout=30)
            await eventually(lambda: acted(first), what="A's handlers at work", timeout=6 * SUMMARY_SECONDS)
            await asyncio.sleep(2 * SUMMARY_SECONDS)  # as long again for a second acting operator's timer
            assert not acted(second) and "holds the Lease" not in second.log.read_text()

            first.process.kill()  # its node gone: no goodbye, the Lease left to expire
            killed = time.monotonic()
            await first.process.wait()
            await eventually(
                lambda: "holds the Lease" in second.log.read_text(), what="B takes over", timeout=30
            )
            print(f"B took the Lease {time.monotonic() - killed:.1f} s after A was killed")  # (-s shows it)
            assert await lease_holder(kube) == holder_of(second)

            replaced = NAMES[1]
            before = kube.pods(NS)[replaced]["metadata"]["uid"]
            await kube.delete_pod(NS, replaced)
            await eventually(
                lambda: replaced in kube.pods(NS) and kube.pods(NS)[replaced]["metadata"]["uid"] != before,
                what="the deleted pod re-created by B",
                timeout=60,
            )
            await eventually(lambda: acted(second), what="B's handlers at work")


async def test_negative_control_two_replicas_without_election_both_act(tmp_path: Path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    async with (
        emulated_cluster() as kube,
        operator_as_deployed(kube.url, replica_values(election=False), tmp_path / "a") as first,
        operator_as_deployed(kube.url, replica_values(election=False), tmp_path / "b") as second,
    ):
        for replica in (first, second):
            await eventually(lambda r=replica: answers_liveness_sync(r), what="both serving")
        await kube.apply(example())
        await eventually(lambda: sorted(kube.pods(NS)) == NAMES, what="the job's pods", timeout=30)
        await eventually(
            lambda: acted(first) and acted(second), what="both operators at work", timeout=3 * SUMMARY_SECONDS
        )


def acted(replica: OperatorProcess) -> bool:
    """The replica's handlers worked on the job: its summary line (operator/log_summary.py) says so."""
    return f"job {NS}/tiny-lm: " in replica.log.read_text()


def answers_liveness_sync(replica: OperatorProcess) -> bool:
    """kopf serves its liveness endpoint once it runs its handlers (checked without an event loop)."""
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", replica.port("healthz"))) == 0


async def test_a_replica_that_loses_its_lease_stops_acting_and_exits(tmp_path: Path):
    """Another replica took the Lease (A was cut off for longer than the lease): A can no longer be
    sure it is the only one acting, so it stops kopf and ends with an error, to come back as a
    standby."""
    (tmp_path / "a").mkdir()
    async with (
        emulated_cluster() as kube,
        operator_as_deployed(kube.url, replica_values(election=True), tmp_path / "a") as first,
    ):
        await eventually(lambda: "holds the Lease" in first.log.read_text(), what="A leads")
        lease = await kube.request("GET", LEASE_PATH)
        lease["spec"]["holderIdentity"] = "another-replica"
        await kube.request("PUT", LEASE_PATH, lease)
        code = await asyncio.wait_for(first.process.wait(), 30)
        assert code == 1
        assert "lost the operator's Lease" in first.log.read_text()
