"""A pod's supervisor that cannot reach a leader (none elected yet: the leader's pod not there yet;
or the one the lease names does not answer) waits for one, within the job's
spec.health.replacementTimeoutSeconds; after that it asks for a new pod (exit 4) and never fails the
job. The operator replaces such a pod without blaming its node.

- `reach_leader` (supervisor/leader_connection.py) with fake leases and connections;
- one pod run by the fake kubelet (tests/support/fake_kubelet.py) whose leader never comes;
- the whole chain: the real operator, a job whose pods' names the DNS serves late (the members find
  the leader by the address in the job's Lease, so nothing waits for the DNS).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from slicekeeper.operator.render import render
from slicekeeper.supervisor.leader.election import Holder, Lease
from slicekeeper.supervisor.leader_connection import (
    LEADER_UNREACHABLE_EXIT_CODE,
    LeaderUnreachable,
    reach_leader,
)

from slicekeeper import credentials
from slicekeeper.api import parse_training_job
from tests.support.fake_kubelet import V5P_16_LABELS, FakeTpuCluster
from tests.support.operator_example import EXAMPLE, NS
from tests.support.operator_harness import Kube, emulated_cluster, eventually, operator

pytestmark = pytest.mark.asyncio

REPLACEMENT_TIMEOUT = 3
DNS_LAG = 20.0
"""Seconds the fake DNS takes to serve a new pod's name, in the test of a slow DNS."""
STARTUP = 60.0
"""Seconds for a supervisor to start in a pod (imports on two shared cores)."""


def lease(term: int, machine: str) -> Lease:
    return Lease(Holder(machine, 0, f"10.0.0.{term}:8490", "abcd"), term, 0.0)


class Leases:
    """The lease as a member sees it: `sequence[i]` once asked i times (the last one from then on)."""

    def __init__(self, *sequence: Lease | None) -> None:
        self.sequence = list(sequence)
        self.asked: list[int] = []

    async def __call__(self, *, newer_than: int, timeout: float) -> Lease | None:
        self.asked.append(newer_than)
        current = self.sequence.pop(0) if len(self.sequence) > 1 else self.sequence[0]
        return current if current is not None and current.term > newer_than else None


class Answering:
    """Connections: the addresses in `answering` accept, the others are refused."""

    def __init__(self, *answering: str) -> None:
        self.answering = set(answering)
        self.tried: list[str] = []

    async def __call__(self, host: str, port: int) -> Any:
        self.tried.append(f"{host}:{port}")
        if f"{host}:{port}" not in self.answering:
            raise ConnectionRefusedError(111, "refused")
        return ("reader", "writer")


class TestReachLeader:
    async def test_the_leader_the_lease_names_is_joined_with_its_term(self):
        found = await reach_leader(
            Leases(lease(2, "b")), term=1, wait=5, open_connection=Answering("10.0.0.2:8490")
        )
        assert found == ("reader", "writer", 2, "10.0.0.2:8490")

    async def test_a_leader_that_does_not_answer_is_left_for_the_next_one_elected(self):
        leases = Leases(lease(1, "a"), None, lease(2, "b"))
        connections = Answering("10.0.0.2:8490")
        assert await reach_leader(leases, term=1, wait=5, open_connection=connections) == (
            "reader",
            "writer",
            2,
            "10.0.0.2:8490",
        )
        # term 1 is tried again after a pause with no newer leader, then the newer one is joined
        assert connections.tried == ["10.0.0.1:8490", "10.0.0.1:8490", "10.0.0.2:8490"]
        assert leases.asked == [0, 1, 1]  # after term 1 failed, only a newer term is waited for

    async def test_the_wait_ends_saying_whom_it_tried(self):
        with pytest.raises(
            LeaderUnreachable, match=r"within 0.3 s: the leader of term 1, a at 10.0.0.1:8490"
        ):
            await reach_leader(Leases(lease(1, "a")), term=1, wait=0.3, open_connection=Answering())
        with pytest.raises(LeaderUnreachable, match="the job's lease names no leader"):
            await reach_leader(Leases(None), term=0, wait=0.3, open_connection=Answering())


def waiting_job(**spec: Any) -> dict[str, Any]:
    """The example job with a workload that only waits (no training: this is about the supervisors)
    and a short spec.health.replacementTimeoutSeconds."""
    job = copy.deepcopy(EXAMPLE)
    job["metadata"]["namespace"] = NS
    job["spec"]["workload"].update(command=["sleep", "600"], args=[], standby=False)
    job["spec"]["health"]["replacementTimeoutSeconds"] = REPLACEMENT_TIMEOUT
    job["spec"].update(spec)
    return job


def terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        if "terminated" in (container.get("state") or {}):
            return dict(container["state"]["terminated"])
    return None


async def test_a_pod_whose_leader_never_comes_asks_for_a_new_pod_instead_of_failing_the_job(tmp_path: Path):
    async with (
        emulated_cluster(watch_seconds=None) as kube,
        FakeTpuCluster(kube, tmp_path / "cluster", V5P_16_LABELS) as cluster,
    ):
        job = waiting_job()
        job["spec"]["checkpoint"]["persistent"]["uri"] = str(tmp_path / "persistent")
        rendered = render(parse_training_job(job, "the test's job"))
        config_map = {
            **rendered.config_map(),
            "metadata": {**rendered.config_map()["metadata"], "namespace": NS},
        }
        await kube.request("POST", f"/api/v1/namespaces/{NS}/configmaps", config_map)
        secret = rendered.credentials_secret(credentials.generate("tiny-lm"))  # as the operator makes it
        secret["metadata"]["namespace"] = NS
        await kube.request("POST", f"/api/v1/namespaces/{NS}/secrets", secret)
        member = next(p for p in rendered.pods() if p["metadata"]["name"] == "tiny-lm-s1-w0")
        member["metadata"]["namespace"] = NS
        await cluster.add_node("b-0", "pool-b")
        await kube.request("POST", f"/api/v1/namespaces/{NS}/pods", member)  # the leader's pod never comes
        ended = await eventually(
            lambda: terminated(kube.pods(NS)["tiny-lm-s1-w0"]), timeout=STARTUP + 90, what="the member's end"
        )
        log = cluster.log_of("tiny-lm-s1-w0")
        assert ended["exitCode"] == LEADER_UNREACHABLE_EXIT_CODE, log[-3000:]
        last = log.strip().splitlines()[-1]
        assert f"no leader reachable within {REPLACEMENT_TIMEOUT} s: the job's lease names no leader" in last
        assert last.endswith(f"exit {LEADER_UNREACHABLE_EXIT_CODE}")


def leader_view(kube: Kube) -> dict[str, Any]:
    text = (kube.pods(NS).get("tiny-lm-s0-w0") or {}).get("metadata", {}).get("annotations", {})
    view = text.get("slicekeeper.dev/status")
    return dict(json.loads(view)) if view else {}


async def test_a_slow_dns_holds_nothing_up_the_members_find_the_leader_in_the_lease(tmp_path: Path):
    """The cluster's DNS serves the pods' names only DNS_LAG seconds after they got their IPs, far
    beyond spec.health.replacementTimeoutSeconds. The members need no name: the job's Lease gives the
    leader's address, so every supervisor joins at once, generation 0 starts, and no pod is replaced
    (before leader election, each member waited for the leader's name and was replaced)."""
    async with (
        emulated_cluster() as kube,
        FakeTpuCluster(kube, tmp_path / "cluster", V5P_16_LABELS, dns_delay=DNS_LAG) as cluster,
        operator(kube),
    ):
        job = waiting_job()
        job["spec"]["checkpoint"]["persistent"]["uri"] = str(tmp_path / "persistent")
        await cluster.add_pools({"pool-a": ["a-0", "a-1"], "pool-b": ["b-0", "b-1"]})
        await kube.apply(job)
        view = await eventually(
            lambda: leader_view(kube).get("state") == "running" and leader_view(kube),
            timeout=STARTUP + 30,
            what="every supervisor joined the leader: generation 0 running",
        )
        assert view["slicesActive"] == 2 and view["generation"] == 0
        assert [e["message"] for e in kube.events(NS) if e["reason"] == "HotSwap"] == []
        assert kube.job(NS, "tiny-lm")["status"]["phase"] != "Failed"
