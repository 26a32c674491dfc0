"""Where a host's supervisor runs, on one machine with the other hosts or in a pod of its own.

What differs between the two, for one host: the addresses its servers listen and are reached at,
where the workloads' JAX coordinator is, how patiently the leader is reached, and the pod's
annotations, a pod's only door to the API server (supervisor/own_pod.py). Locally every supervisor
shares the loopback address of the leader and serves its metrics on a port of its own; in a pod
each has the pod's IP and is reached by its host name through the job's headless Service, and the
leader's supervisor publishes the job's progress on its own pod for the operator's TrainingJob
status.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from typing import Any

from slicekeeper.supervisor import leader_connection
from slicekeeper.supervisor.own_pod import OwnPod
from slicekeeper.supervisor.plan import JobPlan, free_port

from slicekeeper.topology import HostId, JobLayout

POD_STATUS_SECONDS = 5.0
"""In a pod: how often the leader's supervisor publishes the job's progress on its own pod."""

COORDINATOR_PORT = 8476
"""In a pod: the port of JAX's coordinator, in rank 0's workload."""


def spare_index(machine: str) -> int:
    """j, of a spare machine `spare-j`."""
    return int(machine.rsplit("-", 1)[-1])


def metrics_port(plan: JobPlan, host: int, machine: str) -> int:
    """The port of this machine's metrics (0: a free one). Local machines share one address: host i
    on port + i, spare j after the hosts, on port + hosts + j (a spare keeps its port when it takes
    over a host); pods each have theirs."""
    port = plan.metrics_port
    if port and plan.local:
        port += host if host >= 0 else plan.hosts + spare_index(machine)
    return port


def bind_address(plan: JobPlan, leader_host: str) -> str:
    """Where this supervisor's servers listen: locally the leader's loopback host; in a pod its IP
    (every pod has its own), or all interfaces when the pod's IP is not given."""
    if plan.local:
        return leader_host
    return plan.address or "0.0.0.0"


def advertised_address(layout: JobLayout, identity: HostId, bind: str) -> str:
    """The host peers reach this supervisor's servers at."""
    if bind != "0.0.0.0":
        return bind
    return f"{layout.hostname(identity)}.{layout.job_name}"


def coordinator_address(plan: JobPlan, layout: JobLayout, rank0: int) -> str:
    """Where the workloads of a generation whose rank 0 is host `rank0` find JAX's coordinator."""
    if plan.local:
        return f"127.0.0.1:{free_port()}"
    # JAX's coordinator runs in rank 0's workload; peers reach it through the headless Service.
    return f"{layout.hostname(layout.host(rank0))}.{layout.job_name}:{COORDINATOR_PORT}"


async def reach_leader(plan: JobPlan, machine: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """This supervisor's connection to the job's leader. In a pod: waits out a slow DNS name or a late
    leader, then exits 4 for a new pod (supervisor/leader_connection.py)."""
    host, port = plan.leader.rsplit(":", 1)
    return await leader_connection.reach_leader(
        host, int(port), in_pod=not plan.local, replacement_timeout=plan.replacement_timeout, machine=machine
    )


class PodAnnotations:
    """In a pod: what this supervisor writes on its own pod. A failed write is said, never raised."""

    def __init__(self, pod: OwnPod, machine: str) -> None:
        self._pod = pod
        self._machine = machine

    @classmethod
    def of(cls, plan: JobPlan, machine: str) -> PodAnnotations | None:
        """This supervisor's own pod (None: locally, or outside a pod)."""
        pod = None if plan.local else OwnPod.from_env(os.environ)
        return cls(pod, machine) if pod is not None else None

    async def _write(self, write: Callable[[Any], str | None], value: Any) -> bool:
        error = await asyncio.to_thread(write, value)
        if error is not None:
            print(f"[{self._machine}] {error}", file=sys.stderr, flush=True)
        return error is None

    async def ask_replacement(self, reason: str) -> bool:
        """The operator deletes a marked pod and creates its replacement on other capacity."""
        return await self._write(self._pod.ask_replacement, reason)

    async def publish_status(self, status: dict[str, Any]) -> bool:
        return await self._write(self._pod.publish_status, status)

    async def keep_status_published(self, status: Callable[[], dict[str, Any]]) -> None:
        """The leader's view of the job on its own pod, for the operator's TrainingJob status: written
        when it changed (goodput aside), checked every POD_STATUS_SECONDS."""
        published: dict[str, Any] = {}
        while True:
            current = status()
            changed = {**current, "goodput": None} != {**published, "goodput": None}
            if changed and await self.publish_status(current):
                published = current
            await asyncio.sleep(POD_STATUS_SECONDS)
