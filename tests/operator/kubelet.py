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
  namespace (`unshare`): a private /dev/shm, an /etc overlay whose /etc/hosts resolves the job's pod
  host names (`<hostname>.<subdomain>`, the headless Service's DNS) to the pods' IPs, its ConfigMap
  volumes at their mount paths and its emptyDirs. Pod IPs are loopback addresses (127.x.y.z), fixed
  per pod name, so every pod has its own ports as on a real cluster. The process's exit sets the
  pod's phase and its container's exit code; a deleted pod's process is killed;
- node loss: `lose_node` kills the node's processes (SIGKILL: the machine is gone) and marks the Node
  NotReady, as the node controller would.

Pods reach the API server with a kubeconfig (KUBECONFIG) instead of a service-account token.
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

import yaml

from tests.operator.harness import Kube

POOL_LABEL = "cloud.google.com/gke-nodepool"
HOSTNAME_LABEL = "kubernetes.io/hostname"
TPU_RESOURCE = "google.com/tpu"
KILL_GRACE_SECONDS = 5.0


@dataclass
class FakeNode:
    name: str
    pool: str
    labels: dict[str, str]
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
    reported: bool = False


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
    _ips: dict[tuple[str, str], str] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None

    # --- the test's controls ------------------------------------------------------------------
    async def add_node(self, name: str, pool: str) -> None:
        node = FakeNode(name, pool, dict(self.tpu_labels))
        self.nodes[name] = node
        await self.kube.put_node(node.manifest())

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
            except Exception as error:  # a failed round is retried: the API may be restarting
                print(f"fake cluster: {error!r}", file=sys.stderr)
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
            if running.process.poll() is not None and not running.reported:
                await self._report_exit(running)
        for pod in pods:
            uid = pod["metadata"]["uid"]
            node = (pod.get("spec") or {}).get("nodeName")
            if node is None:
                await self._schedule(pod, pods)
            elif self._startable(pod, uid, node):
                await self._start(pod)

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
    def _ip(self, namespace: str, name: str) -> str:
        """A loopback address per pod name: a replacement pod is reachable where its name resolves."""
        key = (namespace, name)
        if key not in self._ips:
            index = len(self._ips) + 10
            self._ips[key] = f"127.{os.getpid() % 200 + 20}.{index // 250}.{index % 250 + 2}"
        return self._ips[key]

    def _hosts_file(self, pod: dict[str, Any], directory: Path) -> Path:
        """/etc/hosts of the pod: every pod of its subdomain, as the headless Service's DNS serves."""
        namespace = pod["metadata"]["namespace"]
        subdomain = pod["spec"].get("subdomain")
        lines = [Path("/etc/hosts").read_text().rstrip()]  # the machine's own names stay
        for other in self.kube.emulator.live("v1/pods", namespace):
            if subdomain and other["spec"].get("subdomain") == subdomain:
                hostname = other["spec"].get("hostname") or other["metadata"]["name"]
                lines.append(f"{self._ip(namespace, other['metadata']['name'])} {hostname}.{subdomain}")
        path = directory / "hosts"
        path.write_text("\n".join(lines) + "\n")
        return path

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

    async def _start(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        [container] = spec["containers"]
        ip = self._ip(namespace, name)
        directory = self.workdir / "pods" / uid
        directory.mkdir(parents=True)
        hosts = self._hosts_file(pod, directory)
        sources = self._volumes(pod, directory)
        # In the pod's own mount namespace: private /dev/shm, an /etc overlay, volumes mounted.
        script = [
            "set -e",
            "mount -t tmpfs tmpfs /dev/shm",
            "mkdir -p /dev/shm/.pod/etc /dev/shm/.pod/work",
            "mount -t overlay overlay"
            " -o lowerdir=/etc,upperdir=/dev/shm/.pod/etc,workdir=/dev/shm/.pod/work /etc",
            f"cp {shlex.quote(str(hosts))} /etc/hosts",
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
        self.running[uid] = RunningPod(uid, name, namespace, spec["nodeName"], process, log, pod)
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        await self.kube.patch_pod(
            namespace,
            name,
            {
                "status": {
                    "phase": "Running",
                    "podIP": ip,
                    "conditions": [
                        {"type": "PodScheduled", "status": "True"},
                        {"type": "Ready", "status": "True"},
                    ],
                    "containerStatuses": [
                        self._container_status(pod, ready=True, state={"running": {"startedAt": started}})
                    ],
                }
            },
        )

    async def _report_exit(self, running: RunningPod) -> None:
        running.reported = True
        code = running.process.returncode
        lines = running.log.read_text(errors="replace").strip().splitlines()
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "message": lines[-1][-500:] if lines else "",
        }
        status = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [
                self._container_status(running.pod, ready=False, state={"terminated": terminated})
            ],
        }
        with contextlib.suppress(AssertionError):  # deleted meanwhile
            await self.kube.patch_pod(running.namespace, running.name, {"status": status})

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
