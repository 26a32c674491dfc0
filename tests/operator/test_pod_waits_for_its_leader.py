"""A pod's supervisor that cannot reach its leader yet (the leader's name not served by the DNS yet,
the leader's pod not there yet) waits for it, within the job's spec.health.replacementTimeoutSeconds;
after that it asks for a new pod (exit 4) and never fails the job. The operator replaces such a pod
without blaming its node.

- `connect` and `reach_leader` (supervisor/leader_connection.py) with a fake clock;
- one pod run by the fake kubelet (tests/support/fake_kubelet.py) whose leader never comes;
- the whole chain: the real operator, a job whose leader pod cannot be scheduled for a while.
"""

from __future__ import annotations

import copy
import json
import socket
from pathlib import Path
from typing import Any

import pytest
from slicekeeper.operator.render import render
from slicekeeper.supervisor.leader_connection import (
    LEADER_UNREACHABLE_EXIT_CODE,
    Clock,
    LeaderUnreachable,
    connect,
    reach_leader,
)
from slicekeeper.supervisor.plan import free_port

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


class FakeClock:
    def __init__(self) -> None:
        self.time = 0.0
        self.pauses: list[float] = []

    def now(self) -> float:
        return self.time

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.time += seconds


class Leader:
    """A leader that answers once `errors` are used up, one per attempt."""

    def __init__(self, errors: list[OSError]) -> None:
        self.errors = errors
        self.attempts = 0

    async def __call__(self, host: str, port: int) -> Any:
        self.attempts += 1
        if self.errors:
            raise self.errors.pop(0)
        return ("reader", "writer")


class TestConnect:
    async def test_a_name_not_served_yet_and_a_leader_not_listening_yet_are_waited_for(self):
        clock = FakeClock()
        errors: list[OSError] = [socket.gaierror(-2, "Name or service not known")] * 3
        leader = Leader(
            [*errors, ConnectionRefusedError(111, "refused"), ConnectionRefusedError(111, "refused")]
        )
        said: list[str] = []
        fake = Clock(clock.now, clock.sleep)
        streams = await connect(
            "tiny-lm-s0-w0.tiny-lm", 8490, wait=60, clock=fake, open_connection=leader, say=said.append
        )
        assert streams == ("reader", "writer") and leader.attempts == 6  # each attempt resolves anew
        assert clock.pauses == [0.05, 0.1, 0.2, 0.4, 0.8]
        assert len(said) == 1 and "not reachable yet" in said[0]  # said once, not at every attempt

    async def test_the_wait_ends_after_the_time_given_with_the_last_error(self):
        clock = FakeClock()
        leader = Leader([socket.gaierror(-2, "Name or service not known")] * 1000)
        with pytest.raises(LeaderUnreachable) as unreachable:
            await connect(
                "x", 1, wait=20, clock=Clock(clock.now, clock.sleep), open_connection=leader, say=print
            )
        assert 18 <= clock.time <= 20 and max(clock.pauses) == 2.0
        assert isinstance(unreachable.value.__cause__, socket.gaierror)

    async def test_a_pod_that_cannot_reach_its_leader_exits_with_the_code_the_operator_replaces_for(
        self, capsys: pytest.CaptureFixture[str]
    ):
        from slicekeeper.operator.handlers import LEADER_UNREACHABLE_EXIT_CODE as OPERATORS_CODE

        closed = free_port()  # nothing listens there
        with pytest.raises(SystemExit) as exited:
            await reach_leader("127.0.0.1", closed, in_pod=True, replacement_timeout=0.5, machine="node-1")
        assert exited.value.code == LEADER_UNREACHABLE_EXIT_CODE == OPERATORS_CODE == 4
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last.startswith("[node-1] leader 127.0.0.1:") and "replacementTimeoutSeconds: 0.5 s" in last


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
        member = next(p for p in rendered.pods() if p["metadata"]["name"] == "tiny-lm-s1-w0")
        member["metadata"]["namespace"] = NS
        await cluster.add_node("b-0", "pool-b")
        await kube.request("POST", f"/api/v1/namespaces/{NS}/pods", member)  # the leader's pod never comes
        ended = await eventually(
            lambda: terminated(kube.pods(NS)["tiny-lm-s1-w0"]), timeout=STARTUP + 90, what="the member's end"
        )
        log = cluster.log_of("tiny-lm-s1-w0")
        assert ended["exitCode"] == LEADER_UNREACHABLE_EXIT_CODE, log[-3000:]
        assert "leader tiny-lm-s0-w0.tiny-lm:8490 not reachable yet" in log
        assert "unreachable for" in log.strip().splitlines()[-1]


def leader_view(kube: Kube) -> dict[str, Any]:
    text = (kube.pods(NS).get("tiny-lm-s0-w0") or {}).get("metadata", {}).get("annotations", {})
    view = text.get("slicekeeper.dev/status")
    return dict(json.loads(view)) if view else {}


async def test_members_that_cannot_resolve_their_leader_yet_are_replaced_on_their_nodes_and_the_job_goes_on(
    tmp_path: Path,
):
    """The cluster's DNS serves the leader's name only DNS_LAG seconds after its pod got its IP, far
    beyond spec.health.replacementTimeoutSeconds: the other supervisors wait, then ask for new pods,
    which the operator makes on the same nodes (nothing is wrong with them: each slice's pool has
    exactly its two nodes). Once the name resolves, every supervisor joins the leader and generation 0
    starts; the job was never Failed."""
    async with (
        emulated_cluster() as kube,
        FakeTpuCluster(kube, tmp_path / "cluster", V5P_16_LABELS, dns_delay=DNS_LAG) as cluster,
        operator(kube),
    ):
        job = waiting_job()
        job["spec"]["checkpoint"]["persistent"]["uri"] = str(tmp_path / "persistent")
        await cluster.add_pools({"pool-a": ["a-0", "a-1"], "pool-b": ["b-0", "b-1"]})
        await kube.apply(job)

        def hot_swaps(*words: str) -> list[str]:
            messages = [e["message"] for e in kube.events(NS) if e["reason"] == "HotSwap"]
            return [m for m in messages if all(word in m for word in words)]

        recreated = await eventually(
            lambda: hot_swaps("re-created"), timeout=STARTUP + 30, what="a member's pod replaced"
        )
        assert all("avoiding nodes: none" in message for message in recreated), recreated
        assert all("could not reach the job's leader" in message for message in recreated), recreated
        view = await eventually(
            lambda: leader_view(kube).get("state") == "running" and leader_view(kube),
            timeout=STARTUP + DNS_LAG + 30,
            what="every supervisor joined the leader: generation 0 running",
        )
        assert view["slicesActive"] == 2 and view["generation"] == 0
        assert all("avoiding nodes: none" in message for message in hot_swaps("re-created"))
        assert kube.job(NS, "tiny-lm")["status"]["phase"] != "Failed"
