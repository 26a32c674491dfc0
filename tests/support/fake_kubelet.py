"""Scheduler, kubelet and node controller for the emulated cluster: pods become local processes.

The emulated API server stores pods; nothing runs them. `FakeTpuCluster` does what a cluster's
control plane and kubelets would, through the same API the operator watches:

- nodes: fake TPU nodes (the GKE TPU labels, one node pool per slice) created as Node objects;
- scheduling: a pod without a node goes to the first node it fits (tests/support/fake_placement.py:
  Ready, uncordoned, its selectors and affinity met, its slice's node pool, one TPU pod per node);
  otherwise PodScheduled=False, reason Unschedulable, as kube-scheduler reports;
- the kubelet: a bound pod's container command runs as a local process with the pod's environment,
  volumes and a mount namespace of its own (tests/support/pod_launch.py). Every pod gets a new IP, a
  loopback address (127.x.y.z), so every pod has its own ports as on a real cluster, and a
  replacement pod is not where its predecessor was. Each node lends its pods' own work one core of
  this machine (`SLICEKEEPER_OWN_WORK_CORE`, as the local runtime does for its hosts). The
  status goes through the pod's status subresource: Running with its IP, then the process's exit as
  the phase and the container's exit code (and termination message, as `terminationMessagePolicy`
  says); a deleted pod's process is killed;
- DNS: /etc/hosts plays the headless Service's DNS. A pod resolves its own name
  (`<hostname>.<subdomain>`) at once, as the kubelet's own hosts entry does on a real cluster; the
  name of another pod resolves to that pod's IP only `dns_delay` seconds after the pod got it (a real
  cluster's DNS lags behind its pods), and stops resolving when the pod is gone. The file is
  rewritten as that changes, under every running pod;
- node loss: `lose_node` kills the node's processes (SIGKILL: the machine is gone) and marks the Node
  NotReady, as the node controller would.

The loop tolerates what a restarting or busy API server causes (connection errors, 429 and 5xx, a
pod deleted or changed meanwhile: the statuses in operator_harness.TRANSIENT_STATUSES) and retries the round;
any other error is a bug in this fake: it is recorded with `Kube.fail`, which fails the test at once
with its traceback (tests/support/operator_harness.py), and the loop stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tests.support.fake_placement import FakeNode, fits
from tests.support.operator_harness import TRANSIENT_STATUSES, ApiError, Kube
from tests.support.pod_launch import mount_script, pod_env, pod_volumes, write_hosts

V5P_16_LABELS = {
    "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
    "cloud.google.com/gke-tpu-topology": "2x2x2",
}
"""The TPU labels of the example job's nodes (v5p-16: a 2x2x2 slice of two hosts)."""
KILL_GRACE_SECONDS = 5.0
DNS_DELAY_SECONDS = 2.0
"""How long after a pod got its IP other pods resolve its name (a real cluster's DNS lags)."""


@dataclass
class RunningPod:
    uid: str
    name: str
    namespace: str
    node: str
    process: subprocess.Popen[bytes]
    log: Path
    pod: dict[str, Any]
    dns: Path
    """The directory of the pod's hosts file, as the kubelet sees it."""
    ip: str
    running_reported: bool = False
    reported: bool = False
    hosts: str = ""
    """What the pod's hosts file says now."""


@dataclass(frozen=True)
class PodAddress:
    ip: str
    since: float
    """When the pod got it (time.monotonic())."""


@dataclass
class FakeTpuCluster:
    kube: Kube
    workdir: Path
    tpu_labels: dict[str, str]
    """The labels every fake TPU node has (accelerator and topology), from the job's pods."""
    nodes: dict[str, FakeNode] = field(default_factory=dict)
    running: dict[str, RunningPod] = field(default_factory=dict)
    """By pod uid."""
    unschedulable: set[str] = field(default_factory=set)
    """Uids already reported Unschedulable (reported once, as the scheduler's condition)."""
    dns_delay: float = DNS_DELAY_SECONDS
    claims: Path | None = None
    """Where the PersistentVolumeClaims the pods mount live (None: under `workdir`): a folder several
    clusters of one session share lets a later job load what an earlier one compiled."""
    _addresses: dict[str, PodAddress] = field(default_factory=dict)
    """By pod uid: every pod its own IP."""
    _task: asyncio.Task[None] | None = None

    # --- the test's controls ------------------------------------------------------------------
    async def add_node(self, name: str, pool: str) -> None:
        node = FakeNode(name, pool, dict(self.tpu_labels), core=len(self.nodes) % (os.cpu_count() or 1))
        self.nodes[name] = node
        await self.kube.put_node(node.manifest())

    async def add_pools(self, pools: dict[str, list[str]]) -> None:
        """Node pools of TPU nodes: {pool: [node names]}."""
        for pool, names in pools.items():
            for name in names:
                await self.add_node(name, pool)

    async def lose_node(self, name: str) -> list[str]:
        """The machine dies: its pods' processes are killed at once, then the Node turns NotReady.
        Returns the pods that ran on it."""
        node = self.nodes[name]
        node.ready = False
        lost = [pod for pod in self.running.values() if pod.node == name]
        for pod in lost:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pod.process.pid, signal.SIGKILL)
            pod.reported = True  # a dead machine reports nothing
        await self.kube.put_node(node.manifest())
        return [pod.name for pod in lost]

    def log_of(self, pod_name: str) -> str:
        logs = sorted(self.workdir.glob(f"pods/*/{pod_name}.log"), key=lambda p: p.stat().st_mtime)
        return logs[-1].read_text(errors="replace") if logs else ""

    # --- the loop -----------------------------------------------------------------------------
    async def __aenter__(self) -> FakeTpuCluster:
        (self.workdir / "pods").mkdir(parents=True, exist_ok=True)
        self._kubeconfig = self.workdir / "kubeconfig"
        self._kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "emulated", "cluster": {"server": self.kube.url}}],
                    "users": [{"name": "pod", "user": {}}],
                    "contexts": [{"name": "emulated", "context": {"cluster": "emulated", "user": "pod"}}],
                    "current-context": "emulated",
                }
            )
        )
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for pod in list(self.running.values()):
            self._kill(pod)
        for pod in list(self.running.values()):
            with contextlib.suppress(subprocess.TimeoutExpired):
                pod.process.wait(KILL_GRACE_SECONDS)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pod.process.pid, signal.SIGKILL)
            pod.process.wait()

    async def _loop(self) -> None:
        while True:
            try:
                await self._tick()
            except Exception as error:
                if not transient(error):
                    self.kube.fail(error)  # a bug here: the test fails with it, now
                    return
                print(f"fake cluster, retrying the round: {error!r}", file=sys.stderr)
            await asyncio.sleep(0.2)

    async def _tick(self) -> None:
        pods = [
            pod for pod in self.kube.emulator.live("v1/pods") if not pod["metadata"].get("deletionTimestamp")
        ]
        live = {pod["metadata"]["uid"] for pod in pods}
        for uid, running in list(self.running.items()):
            if uid not in live:  # deleted: the kubelet kills its containers
                self._kill(running)
                if running.process.poll() is not None:
                    del self.running[uid]
                continue
            if not running.running_reported:  # (a transient error kept it from being said)
                await self._report_running(running)
            if running.process.poll() is not None and not running.reported:
                await self._report_exit(running)
        for pod in pods:
            uid = pod["metadata"]["uid"]
            node = (pod.get("spec") or {}).get("nodeName")
            if node is None:
                await self._schedule(pod, pods)
            elif self._startable(pod, uid, node):
                await self._start(pod, pods)
        self._publish_dns(pods)

    def _startable(self, pod: dict[str, Any], uid: str, node: str) -> bool:
        """Bound here, not started yet, on a node that is alive."""
        pending = (pod.get("status") or {}).get("phase") in (None, "Pending")
        return pending and uid not in self.running and node in self.nodes and self.nodes[node].ready

    # --- the scheduler ------------------------------------------------------------------------
    async def _schedule(self, pod: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        uid = pod["metadata"]["uid"]
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        node = next((n for n in sorted(self.nodes) if fits(self.nodes[n], pod, pods, self.nodes)), None)
        if node is None:
            if uid not in self.unschedulable:
                self.unschedulable.add(uid)
                message = f"0/{len(self.nodes)} nodes are available: none fits the pod's TPU slice"
                condition = {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                }
                await self.kube.patch_pod(
                    namespace, name, {"status": {"phase": "Pending", "conditions": [condition]}}
                )
            return
        await self.kube.patch_pod(namespace, name, {"spec": {"nodeName": node}})
        pod["spec"]["nodeName"] = node  # the next pod of this round sees it placed
        self.unschedulable.discard(uid)

    # --- the kubelet --------------------------------------------------------------------------
    def _ip(self, uid: str) -> str:
        """A new loopback address for every pod (a replacement pod is not where its predecessor was)."""
        if uid not in self._addresses:
            index = len(self._addresses) + 10
            ip = f"127.{os.getpid() % 200 + 20}.{index // 250}.{index % 250 + 2}"
            self._addresses[uid] = PodAddress(ip, time.monotonic())
        return self._addresses[uid].ip

    def _hosts(self, pod: dict[str, Any], pods: list[dict[str, Any]]) -> str:
        """The pod's /etc/hosts: the machine's own names, the pod's own name, and the names of the
        other pods of its subdomain that the DNS serves by now (`dns_delay` after they got an IP)."""
        namespace, uid = pod["metadata"]["namespace"], pod["metadata"]["uid"]
        subdomain = pod["spec"].get("subdomain")
        lines = [Path("/etc/hosts").read_text().rstrip()]
        served_since = time.monotonic() - self.dns_delay
        for other in pods:
            if not subdomain or other["spec"].get("subdomain") != subdomain:
                continue
            if other["metadata"]["namespace"] != namespace:
                continue
            address = self._addresses.get(other["metadata"]["uid"])
            if address is not None and (other["metadata"]["uid"] == uid or address.since <= served_since):
                hostname = other["spec"].get("hostname") or other["metadata"]["name"]
                lines.append(f"{address.ip} {hostname}.{subdomain}")
        return "\n".join(lines) + "\n"

    def _publish_dns(self, pods: list[dict[str, Any]]) -> None:
        """Rewrite the hosts file of every running pod whose view of the DNS changed (atomically: a
        resolver reading it meanwhile sees the old file or the new one)."""
        for running in self.running.values():
            if running.process.poll() is None:
                hosts = self._hosts(running.pod, pods)
                if hosts != running.hosts:
                    write_hosts(running.dns, hosts)
                    running.hosts = hosts

    async def _start(self, pod: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        [container] = spec["containers"]
        ip = self._ip(uid)
        directory = self.workdir / "pods" / uid
        directory.mkdir(parents=True)
        dns = directory / "dns"
        dns.mkdir()
        hosts = self._hosts(pod, pods)
        write_hosts(dns, hosts)
        maps = {c["metadata"]["name"]: c for c in self.kube.emulator.live("v1/configmaps", namespace)}
        secrets = {s["metadata"]["name"]: s for s in self.kube.emulator.live("v1/secrets", namespace)}
        sources = pod_volumes(pod, directory, maps, secrets, self.claims or self.workdir / "claims")
        run_dir = directory / "run-dir"
        run_dir.mkdir()
        script = mount_script(container, sources, run_dir=run_dir, dns=dns)
        argv = [*container["command"], *container.get("args", [])]
        log = directory / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                ["unshare", "--mount", "--map-root-user", "sh", "-c", "\n".join(script), "sh", *argv],
                env=pod_env(
                    pod, container, ip, kubeconfig=self._kubeconfig, core=self.nodes[spec["nodeName"]].core
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.running[uid] = RunningPod(
            uid, name, namespace, spec["nodeName"], process, log, pod, dns, ip, hosts=hosts
        )
        await self._report_running(self.running[uid])

    async def _report_running(self, running: RunningPod) -> None:
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {
            "phase": "Running",
            "podIP": running.ip,
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [
                self._container_status(running.pod, ready=True, state={"running": {"startedAt": started}})
            ],
        }
        await self.kube.patch_pod(running.namespace, running.name, {"status": status})
        running.running_reported = True

    async def _report_exit(self, running: RunningPod) -> None:
        code = running.process.returncode
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "message": self._termination_message(running, code),
        }
        status = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [
                self._container_status(running.pod, ready=False, state={"terminated": terminated})
            ],
        }
        try:
            await self.kube.patch_pod(running.namespace, running.name, {"status": status})
        except ApiError as error:
            if error.status != 404:  # 404: deleted meanwhile, nothing to report to
                raise  # (a transient error: reported again in the next round)
        running.reported = True

    @staticmethod
    def _termination_message(running: RunningPod, code: int) -> str:
        """As the kubelet fills it: the container's terminationMessagePath file (none is written
        here), or, with `terminationMessagePolicy: FallbackToLogsOnError` and a failure, the end of
        its log (at most 80 lines and 2048 bytes)."""
        [container] = running.pod["spec"]["containers"]
        if code == 0 or container.get("terminationMessagePolicy") != "FallbackToLogsOnError":
            return ""
        lines = running.log.read_bytes().splitlines()[-80:]
        return b"\n".join(lines)[-2048:].decode(errors="replace")

    @staticmethod
    def _container_status(pod: dict[str, Any], *, ready: bool, state: dict[str, Any]) -> dict[str, Any]:
        """As the kubelet reports a container (the client's models require every field here)."""
        [container] = pod["spec"]["containers"]
        image = container.get("image", "")
        return {
            "name": container["name"],
            "image": image,
            "imageID": f"local://{image}",
            "restartCount": 0,
            "ready": ready,
            "state": state,
        }

    def _kill(self, running: RunningPod) -> None:
        if running.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(running.process.pid, signal.SIGTERM)
        asyncio.get_running_loop().call_later(KILL_GRACE_SECONDS, self._force_kill, running)

    @staticmethod
    def _force_kill(running: RunningPod) -> None:
        if running.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(running.process.pid, signal.SIGKILL)


def transient(error: Exception) -> bool:
    """An error a controller retries: the API server unreachable, busy or restarting, or the object
    changed or gone meanwhile (see operator_harness.TRANSIENT_STATUSES)."""
    if isinstance(error, ApiError):
        return error.status in TRANSIENT_STATUSES
    return isinstance(error, aiohttp.ClientConnectionError | asyncio.TimeoutError)
