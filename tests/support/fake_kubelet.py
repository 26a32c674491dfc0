"""Scheduler, kubelet and node controller for the emulated cluster: pods become local processes.

The emulated API server stores pods; nothing runs them. `FakeTpuCluster` does what a cluster's
control plane and kubelets would, through the same API the operator watches:

- nodes: fake TPU nodes (the GKE TPU labels, one node pool per slice) created as Node objects;
- scheduling: a pod without a node goes to a Ready, uncordoned node that matches its nodeSelector and
  required node affinity (`kubernetes.io/hostname NotIn`), in the node pool its slice already uses and
  not in a pool another slice of its job uses, one TPU pod per node; otherwise PodScheduled=False,
  reason Unschedulable, as kube-scheduler reports;
- the kubelet: a bound pod's container command runs as a local process with the pod's environment
  (downward API fields resolved; `python` is this virtual environment's). Each pod gets its own mount
  namespace (`unshare`): a private /dev/shm, an /etc overlay, its ConfigMap volumes at their mount
  paths and its emptyDirs, and a private supervisor run directory (/tmp/slicekeeper: logs, the SDK
  socket, the job summary; the rest of /tmp is shared, as a bucket is). Every pod gets a new IP, a
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

Pods reach the API server with a kubeconfig (KUBECONFIG) instead of a service-account token.

The loop tolerates what a restarting or busy API server causes (connection errors, 429 and 5xx, a
pod deleted or changed meanwhile: the statuses in operator_harness.TRANSIENT_STATUSES) and retries the round;
any other error is a bug in this fake: it is recorded with `Kube.fail`, which fails the test at once
with its traceback (tests/support/operator_harness.py), and the loop stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from slicekeeper.supervisor.pod_plan import RUN_DIR

from slicekeeper import protocol
from tests.support.operator_harness import TRANSIENT_STATUSES, ApiError, Kube

V5P_16_LABELS = {
    "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
    "cloud.google.com/gke-tpu-topology": "2x2x2",
}
"""The TPU labels of the example job's nodes (v5p-16: a 2x2x2 slice of two hosts)."""
POOL_LABEL = "cloud.google.com/gke-nodepool"
HOSTNAME_LABEL = "kubernetes.io/hostname"
TPU_RESOURCE = "google.com/tpu"
KILL_GRACE_SECONDS = 5.0
DNS_DELAY_SECONDS = 2.0
"""How long after a pod got its IP other pods resolve its name (a real cluster's DNS lags)."""
HOSTS_DIR = "/etc/.pod-dns"
"""Where a pod's mount namespace sees the directory the kubelet keeps its hosts file in (/etc/hosts
links to the file there, so that the kubelet can replace it while the pod runs)."""


@dataclass
class FakeNode:
    name: str
    pool: str
    labels: dict[str, str]
    core: int = 0
    """The core of this machine its pods' own work runs on (separate machines never compete for
    one while they compute; see docs/supervisor.md, "Straggler detection")."""
    ready: bool = True
    cordoned: bool = False

    def manifest(self) -> dict[str, Any]:
        ready = "True" if self.ready else "False"
        return {
            "metadata": {
                "name": self.name,
                "labels": {**self.labels, POOL_LABEL: self.pool, HOSTNAME_LABEL: self.name},
            },
            "spec": {"unschedulable": self.cordoned},
            "status": {
                "capacity": {TPU_RESOURCE: "4"},
                "allocatable": {TPU_RESOURCE: "4"},
                "conditions": [{"type": "Ready", "status": ready, "reason": "KubeletReady"}],
            },
        }


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
    def _fits(self, node: FakeNode, pod: dict[str, Any], pods: list[dict[str, Any]]) -> bool:
        spec = pod["spec"]
        labels = node.manifest()["metadata"]["labels"]
        if not node.ready or node.cordoned:
            return False
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            return False
        required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        for term in (required or {}).get("nodeSelectorTerms", []):
            for expression in term.get("matchExpressions", []):
                value = labels.get(expression["key"])
                if expression["operator"] == "NotIn" and value in expression["values"]:
                    return False
                if expression["operator"] == "In" and value not in expression["values"]:
                    return False
        if any((p.get("spec") or {}).get("nodeName") == node.name for p in pods):
            return False  # one TPU host pod per node: it takes every chip
        mine = pod["metadata"]["labels"]
        job, slice_index = mine["slicekeeper.dev/job"], mine["slicekeeper.dev/slice"]
        for other in pods:
            placed = (other.get("spec") or {}).get("nodeName")
            theirs = other["metadata"]["labels"]
            if placed not in self.nodes or theirs.get("slicekeeper.dev/job") != job:
                continue
            same_slice = theirs.get("slicekeeper.dev/slice") == slice_index
            same_pool = self.nodes[placed].pool == node.pool
            if same_slice != same_pool:
                return False  # a slice is one node pool, and a pool serves one slice
        return True

    async def _schedule(self, pod: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        uid = pod["metadata"]["uid"]
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        node = next((n for n in sorted(self.nodes) if self._fits(self.nodes[n], pod, pods)), None)
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
                    self._write_hosts(running.dns, hosts)
                    running.hosts = hosts

    @staticmethod
    def _write_hosts(directory: Path, hosts: str) -> None:
        staged = directory / "hosts.new"
        staged.write_text(hosts)
        os.replace(staged, directory / "hosts")

    def _env(self, pod: dict[str, Any], container: dict[str, Any], ip: str) -> dict[str, str]:
        fields = {
            "metadata.name": pod["metadata"]["name"],
            "metadata.namespace": pod["metadata"]["namespace"],
            "status.podIP": ip,
            "spec.nodeName": pod["spec"]["nodeName"],
        }
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": "/tmp",
            "KUBECONFIG": str(self._kubeconfig),
            "PYTHONUNBUFFERED": "1",
            protocol.ENV_OWN_WORK_CORE: str(self.nodes[pod["spec"]["nodeName"]].core),
        }
        for variable in container.get("env") or []:
            if "value" in variable:
                env[variable["name"]] = variable["value"]
            else:
                env[variable["name"]] = fields[variable["valueFrom"]["fieldRef"]["fieldPath"]]
        return env

    def _volumes(self, pod: dict[str, Any], directory: Path) -> dict[str, str]:
        """volume name -> a directory holding its content (ConfigMaps as files, emptyDirs empty)."""
        namespace = pod["metadata"]["namespace"]
        maps = {c["metadata"]["name"]: c for c in self.kube.emulator.live("v1/configmaps", namespace)}
        sources: dict[str, str] = {}
        for volume in pod["spec"].get("volumes") or []:
            path = directory / "volumes" / volume["name"]
            path.mkdir(parents=True)
            if "configMap" in volume:
                for key, text in maps[volume["configMap"]["name"]].get("data", {}).items():
                    (path / key).write_text(text)
            sources[volume["name"]] = str(path)
        return sources

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
        self._write_hosts(dns, hosts)
        sources = self._volumes(pod, directory)
        run_dir = directory / "run-dir"
        run_dir.mkdir()
        # In the pod's own mount namespace: private /dev/shm, an /etc overlay, volumes mounted; its
        # /etc/hosts a link into the directory the kubelet rewrites the file in; the supervisor's run
        # directory its own, as a container's file system is (the rest of /tmp stays shared: tests
        # keep "remote" storage there, as a bucket is shared).
        script = [
            "set -e",
            f"mkdir -p {RUN_DIR}",
            f"mount --bind {shlex.quote(str(run_dir))} {RUN_DIR}",
            "mount -t tmpfs tmpfs /dev/shm",
            "mkdir -p /dev/shm/.pod/etc /dev/shm/.pod/work",
            "mount -t overlay overlay"
            " -o lowerdir=/etc,upperdir=/dev/shm/.pod/etc,workdir=/dev/shm/.pod/work /etc",
            f"mkdir -p {HOSTS_DIR}",
            f"mount --bind {shlex.quote(str(dns))} {HOSTS_DIR}",
            f"ln -sf {HOSTS_DIR}/hosts /etc/hosts",
        ]
        for mount in container.get("volumeMounts") or []:
            target = shlex.quote(mount["mountPath"])
            script += [f"mkdir -p {target}", f"mount --bind {shlex.quote(sources[mount['name']])} {target}"]
        script.append('exec "$@"')
        argv = [*container["command"], *container.get("args", [])]
        log = directory / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                ["unshare", "--mount", "--map-root-user", "sh", "-c", "\n".join(script), "sh", *argv],
                env=self._env(pod, container, ip),
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
