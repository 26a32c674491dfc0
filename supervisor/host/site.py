"""Where a host's supervisor runs: on one machine with the other hosts, or in a pod of its own.

Chosen once, at start-up (`site_of`): a `LocalSite` for `slicekeeper run`, a `PodSite` in a cluster.
Everything that differs between the two for one host is a question to that object, never a flag
read here and there: the addresses its servers listen and are reached at, where the workloads' JAX
coordinator is, the job's lease and how patiently the leader is reached, the machine's cores for the
workload's own work, what the workload's command and environment take from where it runs
(supervisor.host.workload), how the leader brings a lost host's successor (spare supervisors or a
new pod, supervisor.leader.capacity), whether the leader's events go to the log, and the pod's
annotations (a pod's only door to the API server, supervisor/pod/own_pod.py). No other module of the
supervisors branches on local or cluster (tests/unit/test_code_vocabulary.py). Locally every
supervisor shares the loopback address of the leader and serves its metrics on a port of its own; in
a pod each has the pod's IP and is reached by its host name through the job's headless Service, and
the leader's supervisor publishes the job's progress on its own pod for the operator's TrainingJob
status.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from slicekeeper.supervisor import leader_connection
from slicekeeper.supervisor.host.confinement import SERVICE_ACCOUNT_DIR
from slicekeeper.supervisor.host.workload import GO_VARIABLES, own_cores
from slicekeeper.supervisor.leader.capacity import Replacements, declared_spares, pod_replacements
from slicekeeper.supervisor.leader.election import Election, Holder, cluster_election, local_election
from slicekeeper.supervisor.plan import JobPlan
from slicekeeper.supervisor.pod.own_pod import OwnPod
from slicekeeper.supervisor.ports import free_port

from slicekeeper import protocol
from slicekeeper.shape import HostId, JobLayout

POD_STATUS_SECONDS = 5.0
"""In a pod: how often the leader's supervisor publishes the job's progress on its own pod."""

METRICS_TARGETS_DIR = "prometheus-targets"
"""Locally, in the run's directory: where Prometheus finds each machine's metrics (`<machine>.json`,
file_sd; Prometheus takes a wildcard in a file name only, so they share one folder)."""

COORDINATOR_PORT = 8476
"""In a pod: the port of JAX's coordinator, in rank 0's workload."""


def spare_index(machine: str) -> int:
    """j, of a spare machine `spare-j`."""
    return int(machine.rsplit("-", 1)[-1])


def lease_name(job_name: str) -> str:
    """The job's leader-election Lease (the operator grants its supervisors this one alone)."""
    return f"{job_name}-leader"


class Site(ABC):
    """One host's supervisor's surroundings; `plan.leader` is `host:port` of the first leader."""

    local: bool
    """Which site this is, for whoever describes it; what differs is asked of the methods below."""
    log_events: bool
    """The leader's events also go to its log (a pod's log is all an operator of the cluster reads)."""

    def __init__(self, plan: JobPlan) -> None:
        self.plan = plan
        self.leader_host, self.leader_port = plan.leader.rsplit(":", 1)
        self.cut_off = False
        """Chaos `partition` cut this machine off the network (supervisor.host.partition)."""

    @abstractmethod
    def metrics_port(self, host: int | None, machine: str) -> int:
        """The port of this machine's metrics (0: a free one); `host` None: a spare's."""

    @abstractmethod
    def bind_address(self) -> str:
        """Where this supervisor's servers listen."""

    def advertised_address(self, layout: JobLayout, identity: HostId | None, bind: str) -> str:
        """The host peers reach this supervisor's servers at (`identity` None: a spare's, which has no
        host name of the job's)."""
        if bind != "0.0.0.0" or identity is None:
            return bind
        return f"{layout.hostname(identity)}.{layout.job_name}"

    def relays(self, host: int | None) -> list[str]:
        """The relays `host`'s supervisor reaches the leader through, in the order it tries them
        (spec.controlPlane.relays; empty: it reaches the leader directly, as a spare does)."""
        control = self.plan.training_job.spec.control_plane
        if host is None or not control.relays:
            return []
        return [self.relay_address(h) for h in self.plan.shape.relay_group(host, control.hosts_per_relay)]

    def lease_candidates(self) -> tuple[int, ...] | None:
        """The hosts whose supervisors read and write the job's lease (spec.controlPlane: with
        relays, a few; None: every host's, as without relays)."""
        control = self.plan.training_job.spec.control_plane
        if not control.relays:
            return None
        return self.plan.shape.lease_candidates(control.lease_candidates)

    @abstractmethod
    def relay_address(self, host: int) -> str:
        """host:port of the relay server of `host`'s supervisor."""

    @abstractmethod
    def relay_port(self, host: int) -> int:
        """The port `host`'s supervisor serves its relay at."""

    @abstractmethod
    def coordinator_address(self, layout: JobLayout, rank0: int) -> str:
        """Where the workloads of a generation whose rank 0 is host `rank0` find JAX's coordinator."""

    @abstractmethod
    def leader_address(self, host: int | None, advertised: str) -> tuple[str, socket.socket | None]:
        """Where this supervisor's leader server listens if it is elected, and the socket bound to
        it now when the port is taken at start-up (None: the port is the pod's own)."""

    @abstractmethod
    def election(self, own: Holder) -> Election:
        """This supervisor's candidacy on the job's lease."""

    @property
    @abstractmethod
    def leader_wait(self) -> float:
        """How long a supervisor looks for a leader before giving up (supervisor.leader_connection)."""

    @property
    @abstractmethod
    def leader_unreachable_exit_code(self) -> int:
        """How a supervisor that found no leader ends."""

    @property
    @abstractmethod
    def replacement_timeout(self) -> float | None:
        """How long the leader awaits a lost host's new pod; None: spare supervisors stand in
        (supervisor.leader.capacity)."""

    @abstractmethod
    def replacements(self) -> Replacements:
        """Where the leader gets a lost host's successor (supervisor.leader.capacity): spare
        supervisors locally, new pods in a cluster."""

    @abstractmethod
    def reachable(self, layout: JobLayout, hostnames: list[str]) -> list[str]:
        """Host names as the workload reaches them."""

    @abstractmethod
    def megascale_coordinator(self, layout: JobLayout, first: HostId) -> str | None:
        """Where the workload finds the multislice coordinator when `first` is the world's first host
        (None: the workload is told none)."""

    go_variables: tuple[str, ...]
    """What `go` tells a promoted standby (supervisor.host.workload.go_env)."""

    @abstractmethod
    def machine_env(
        self, layout: JobLayout, host: int, *, temp_dir: Path, cores: Sequence[int], env: Mapping[str, str]
    ) -> dict[str, str]:
        """The workload's variables that come from the machine it runs on, over `env` (its
        environment so far): `cores`, the machine's (a host's own work gets one of them), `temp_dir`
        its own temporary directory."""

    @abstractmethod
    def command(self, argv: list[str]) -> list[str]:
        """The workload's command line (`argv`: the spec's command and arguments) as run here."""

    @abstractmethod
    def cores(self) -> list[int]:
        """The machine's cores, of which each host's own work gets one when hosts share the machine."""

    @abstractmethod
    def pod(self, machine: str) -> PodAnnotations | None:
        """What this supervisor writes on its own pod (None: no pod)."""

    def hidden_from_workload(self) -> list[Path]:
        """What the workload may not read (supervisor.host.confinement): the job's credentials."""
        return [Path(self.plan.credentials)]

    @abstractmethod
    def announce_metrics(self, machine: str, address: str, port: int) -> None:
        """Tell Prometheus where this machine's metrics are, labelled as the job's."""


class LocalSite(Site):
    """`slicekeeper run`: every host's supervisor a process of one machine."""

    local = True
    log_events = False

    def metrics_port(self, host: int | None, machine: str) -> int:
        """Local machines share one address: host i on port + i, spare j after the hosts, on port +
        hosts + j (a spare keeps its port when it takes over a host)."""
        port = self.plan.metrics_port
        if port:
            if host is None or host < 0:  # a spare (a lease's holder says -1)
                host = self.plan.shape.host_count + spare_index(machine)
            port += host
        return port

    def bind_address(self) -> str:
        return self.leader_host  # the loopback address of the run

    def announce_metrics(self, machine: str, address: str, port: int) -> None:
        """`<run dir>/prometheus-targets/<machine>.json`, a Prometheus file_sd entry with the labels
        the chart's PodMonitor gives a pod's series (namespace, pod, trainingjob): a Prometheus
        pointed at `<run dir>/prometheus-targets/*.json` scrapes a local run as it would the job in a
        cluster. Written whole or not at all (Prometheus never reads half a file)."""
        metadata = self.plan.training_job.metadata
        target = [
            {
                "targets": [f"{address}:{port}"],
                "labels": {
                    "namespace": metadata.namespace or "default",
                    "trainingjob": metadata.name,
                    "pod": machine,
                },
            }
        ]
        folder = Path(self.plan.run_dir) / METRICS_TARGETS_DIR
        folder.mkdir(exist_ok=True)
        path = folder / f"{machine}.json"
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(target, indent=1))
        os.replace(partial, path)

    def coordinator_address(self, layout: JobLayout, rank0: int) -> str:
        return f"127.0.0.1:{free_port()}"

    def relay_address(self, host: int) -> str:
        return f"{self.leader_host}:{self.relay_port(host)}"

    def relay_port(self, host: int) -> int:
        """The plan's port of `host` (the run chose them at its start)."""
        return self.plan.relay_ports[host]

    def leader_address(self, host: int | None, advertised: str) -> tuple[str, socket.socket | None]:
        """A port bound now, so that no other process of the machine takes it before an election:
        the plan's leader port for the first leader (host 0) if it is still free, any port otherwise
        (members find the leader's address in the lease)."""
        wanted = int(self.leader_port) if host == 0 else 0
        reserved = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # no SO_REUSEADDR: nobody shares it
        try:
            reserved.bind((self.leader_host, wanted))
        except OSError:
            reserved.bind((self.leader_host, 0))  # taken meanwhile by another process of the machine
        return f"{self.leader_host}:{reserved.getsockname()[1]}", reserved

    def election(self, own: Holder) -> Election:
        """On a lease file in the run directory."""
        return local_election(Path(self.plan.run_dir), own)

    @property
    def leader_wait(self) -> float:
        """A minute: the leader is a process on the same machine; not there by then, the run is broken."""
        return leader_connection.LOCAL_WAIT_SECONDS

    @property
    def leader_unreachable_exit_code(self) -> int:
        """Exit 1 (the run is broken), unless this machine is cut off by a chaos partition: then, as
        a pod cut off would, it asks for its replacement (the run goes on without it)."""
        return leader_connection.LEADER_UNREACHABLE_EXIT_CODE if self.cut_off else protocol.EXIT_JOB_FAILED

    @property
    def replacement_timeout(self) -> float | None:
        return None

    def replacements(self) -> Replacements:
        """Idle spare supervisors take over lost hosts; a host lost before the start waits for one of
        the declared spares that has not registered yet."""
        health = self.plan.training_job.spec.health
        return declared_spares(self.plan.spares, health.startup_timeout_seconds)

    def reachable(self, layout: JobLayout, hostnames: list[str]) -> list[str]:
        return hostnames  # no Service to resolve them through: names only

    def megascale_coordinator(self, layout: JobLayout, first: HostId) -> str | None:
        return None  # JAX is given its coordinator; the names would not resolve

    go_variables = tuple(v for v in GO_VARIABLES if v != protocol.ENV_MEGASCALE_COORDINATOR_ADDRESS)
    """Without the multislice coordinator: a standby's own is the supervisor's, not the generation's."""

    def machine_env(
        self, layout: JobLayout, host: int, *, temp_dir: Path, cores: Sequence[int], env: Mapping[str, str]
    ) -> dict[str, str]:
        """CPU devices, as many as a host of the layout has; each host's own work on one core of the
        shared machine; a temporary directory of its own (the run's directory may be in /tmp, whose
        new entries a confined workload cannot read: supervisor.host.confinement)."""
        devices = layout.shape.devices_per_host
        machine = {
            "TMPDIR": str(temp_dir),
            protocol.ENV_DEVICES_PER_HOST: str(devices),
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": (
                env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
            ).strip(),
        }
        if cores:
            machine[protocol.ENV_OWN_WORK_CORE] = str(cores[host % len(cores)])
        return machine

    def command(self, argv: list[str]) -> list[str]:
        """`python` is the supervisor's own interpreter: the runtime's environment has slicekeeper."""
        if argv[0] in ("python", "python3"):
            return [sys.executable, *argv[1:]]
        return argv

    def cores(self) -> list[int]:
        return own_cores()

    def pod(self, machine: str) -> PodAnnotations | None:
        return None


class PodSite(Site):
    """In a cluster: one pod per TPU host, each with its own IP, reached through the headless Service."""

    local = False
    log_events = True

    def metrics_port(self, host: int | None, machine: str) -> int:
        return self.plan.metrics_port  # every pod has its own address

    def announce_metrics(self, machine: str, address: str, port: int) -> None:
        """Nothing to write: the chart's PodMonitor finds the pod and labels its series."""

    def bind_address(self) -> str:
        """The pod's IP, or all interfaces when it is not given."""
        return self.plan.address or "0.0.0.0"

    def coordinator_address(self, layout: JobLayout, rank0: int) -> str:
        """JAX's coordinator runs in rank 0's workload; peers reach it through the headless Service."""
        return f"{layout.hostname(layout.host(rank0))}.{layout.job_name}:{COORDINATOR_PORT}"

    def relay_address(self, host: int) -> str:
        """Through the headless Service, as JAX's coordinator: the pod of `host` keeps its name when
        it is replaced."""
        layout = self.plan.layout
        return f"{layout.hostname(layout.host(host))}.{layout.job_name}:{protocol.RELAY_PORT}"

    def relay_port(self, host: int) -> int:
        return protocol.RELAY_PORT

    def leader_address(self, host: int | None, advertised: str) -> tuple[str, socket.socket | None]:
        return f"{advertised}:{self.leader_port}", None

    def election(self, own: Holder) -> Election:
        """On the job's coordination.k8s.io Lease (named after the job, in the pod's namespace)."""
        namespace = os.environ.get(protocol.ENV_POD_NAMESPACE) or "default"
        job = self.plan.layout.job_name
        return cluster_election(lease_name(job), namespace, own, job, os.environ.get(protocol.ENV_JOB_UID))

    @property
    def leader_wait(self) -> float:
        """spec.health.replacementTimeoutSeconds: the time a leader gives a lost host's new pod."""
        return self.replacement_timeout

    @property
    def leader_unreachable_exit_code(self) -> int:
        """Ask the operator for a new pod (exit 1 would mean the job failed)."""
        return leader_connection.LEADER_UNREACHABLE_EXIT_CODE

    @property
    def replacement_timeout(self) -> float:
        """The plan's, else spec.health.replacementTimeoutSeconds."""
        timeout = self.plan.replacement_timeout
        return timeout or self.plan.training_job.spec.health.replacement_timeout_seconds

    def replacements(self) -> Replacements:
        """The operator replaces a lost host's pod, awaited up to `replacement_timeout`."""
        return pod_replacements(self.replacement_timeout)

    def reachable(self, layout: JobLayout, hostnames: list[str]) -> list[str]:
        """Through the job's headless Service."""
        return [f"{name}.{layout.job_name}" for name in hostnames]

    def megascale_coordinator(self, layout: JobLayout, first: HostId) -> str | None:
        return self.reachable(layout, [layout.hostname(first)])[0]

    go_variables = GO_VARIABLES

    def machine_env(
        self, layout: JobLayout, host: int, *, temp_dir: Path, cores: Sequence[int], env: Mapping[str, str]
    ) -> dict[str, str]:
        return {}  # real devices, the pod's own machine and temporary directory

    def command(self, argv: list[str]) -> list[str]:
        return argv

    def cores(self) -> list[int]:
        return []  # the pod's machine is its own

    def hidden_from_workload(self) -> list[Path]:
        """The job's credentials and the pod's service-account token: the training code gets no
        right of the supervisor's in the cluster."""
        return [*super().hidden_from_workload(), SERVICE_ACCOUNT_DIR]

    def pod(self, machine: str) -> PodAnnotations | None:
        own = OwnPod.from_env(os.environ)
        return PodAnnotations(own, machine) if own is not None else None


def site_of(plan: JobPlan) -> Site:
    """The site a plan describes, decided once."""
    return LocalSite(plan) if plan.local else PodSite(plan)


class PodAnnotations:
    """In a pod: what this supervisor writes on its own pod. A failed write is said, never raised."""

    def __init__(self, pod: OwnPod, machine: str) -> None:
        self._pod = pod
        self._machine = machine

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

    async def keep_status_published(
        self, status: Callable[[], Mapping[str, Any]], leading: Callable[[], bool]
    ) -> None:
        """The leader's view of the job on its own pod, for the operator's TrainingJob status: written
        when it changed (goodput aside), checked every POD_STATUS_SECONDS, and only while `leading`
        (fenced: a leader paused past its renew deadline wakes up to a stale view, and writes none)."""
        published: dict[str, Any] = {}
        while True:
            current = dict(status())
            changed = {**current, "goodput": None} != {**published, "goodput": None}
            if changed and leading() and await self.publish_status(current):
                published = current
            await asyncio.sleep(POD_STATUS_SECONDS)
