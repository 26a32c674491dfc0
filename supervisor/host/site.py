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
from pathlib import Path
from typing import Any

from slicekeeper.supervisor import leader_connection
from slicekeeper.supervisor.leader.election import Election, Holder, cluster_election, local_election
from slicekeeper.supervisor.own_pod import OwnPod
from slicekeeper.supervisor.plan import JobPlan, free_port

from slicekeeper import protocol
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


def leader_address(plan: JobPlan, host: int, advertised: str) -> str:
    """Where this supervisor's leader server listens if it is elected. Locally the first leader
    (host 0) serves on the plan's leader address and every other on a free port of its own; in a
    pod every supervisor uses the plan's leader port on its own address."""
    leader_host, port = plan.leader.rsplit(":", 1)
    if plan.local:
        return plan.leader if host == 0 else f"{leader_host}:{free_port(leader_host)}"
    return f"{advertised}:{port}"


def election(plan: JobPlan, own: Holder) -> Election:
    """This supervisor's candidacy: on a lease file in the run directory locally, on the job's
    coordination.k8s.io Lease in a pod (named after the job, in the pod's namespace)."""
    if plan.local:
        return local_election(Path(plan.run_dir), own)
    namespace = os.environ.get(protocol.ENV_POD_NAMESPACE) or "default"
    return cluster_election(lease_name(plan.layout.job_name), namespace, own)


def lease_name(job_name: str) -> str:
    """The job's leader-election Lease (the operator grants its supervisors this one alone)."""
    return f"{job_name}-leader"


def leader_wait(plan: JobPlan) -> float:
    """How long a supervisor looks for a leader before giving up: locally a minute (the run is
    broken); in a pod spec.health.replacementTimeoutSeconds (supervisor/leader_connection.py)."""
    if plan.local or plan.replacement_timeout is None:
        return leader_connection.LOCAL_WAIT_SECONDS
    return plan.replacement_timeout


def leader_unreachable_exit_code(plan: JobPlan) -> int:
    """Locally: the run failed (1). In a pod: ask the operator for a new pod."""
    return 1 if plan.local else leader_connection.LEADER_UNREACHABLE_EXIT_CODE


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
