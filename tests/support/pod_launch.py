"""How the fake kubelet (tests/support/fake_kubelet.py) sets up a pod's process: its environment,
its volumes and the script that gives it a mount namespace of its own (`unshare`).

In that namespace the pod has a private /dev/shm, an /etc overlay, its ConfigMap volumes at their
mount paths and its emptyDirs, and a private supervisor run directory (/tmp/slicekeeper: logs, the
SDK socket, the job summary; the rest of /tmp is shared, as a bucket is). Its /etc/hosts links into
a directory the kubelet keeps the pod's hosts file in (`write_hosts` replaces it atomically).
Pods reach the API server with a kubeconfig (KUBECONFIG) instead of a service-account token.
"""

from __future__ import annotations

import base64
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slicekeeper.supervisor.pod.pod_plan import RUN_DIR

from slicekeeper import protocol

HOSTS_DIR = "/etc/.pod-dns"
"""Where a pod's mount namespace sees the directory the kubelet keeps its hosts file in (/etc/hosts
links to the file there, so that the kubelet can replace it while the pod runs)."""


def pod_env(
    pod: dict[str, Any], container: dict[str, Any], ip: str, *, kubeconfig: Path, core: int
) -> dict[str, str]:
    """The container's environment: its own variables (downward API fields resolved), a PATH whose
    `python` is this virtual environment's, the kubeconfig and the core of the pod's node."""
    fields = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "metadata.uid": pod["metadata"]["uid"],
        "status.podIP": ip,
        "spec.nodeName": pod["spec"]["nodeName"],
    }
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": "/tmp",
        "KUBECONFIG": str(kubeconfig),
        "PYTHONUNBUFFERED": "1",
        protocol.ENV_OWN_WORK_CORE: str(core),
    }
    for variable in container.get("env") or []:
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        else:
            env[variable["name"]] = fields[variable["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def pod_volumes(
    pod: dict[str, Any],
    directory: Path,
    config_maps: Mapping[str, dict[str, Any]],
    secrets: Mapping[str, dict[str, Any]],
    claims: Path,
) -> dict[str, str]:
    """volume name -> a directory holding its content (ConfigMaps and Secrets as files, the latter
    with their defaultMode; emptyDirs empty; a PersistentVolumeClaim's the folder `claims/<name>`
    every pod that mounts the claim shares, as a ReadWriteMany volume is)."""
    sources: dict[str, str] = {}
    for volume in pod["spec"].get("volumes") or []:
        if "persistentVolumeClaim" in volume:
            shared = claims / volume["persistentVolumeClaim"]["claimName"]
            shared.mkdir(parents=True, exist_ok=True)
            sources[volume["name"]] = str(shared)
            continue
        path = directory / "volumes" / volume["name"]
        path.mkdir(parents=True)
        if "configMap" in volume:
            for key, text in config_maps[volume["configMap"]["name"]].get("data", {}).items():
                (path / key).write_text(text)
        if "secret" in volume:
            name = volume["secret"]["secretName"]
            if name not in secrets:
                raise LookupError(f"pod {pod['metadata']['name']}: Secret {name} does not exist")
            for key, text in secrets[name].get("data", {}).items():
                (path / key).write_bytes(base64.b64decode(text))
                (path / key).chmod(volume["secret"].get("defaultMode", 0o644))
        sources[volume["name"]] = str(path)
    return sources


def mount_script(
    container: dict[str, Any], sources: Mapping[str, str], *, run_dir: Path, dns: Path
) -> list[str]:
    """The shell script that sets up the pod's own mount namespace, then runs the container's command."""
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
    return script


def write_hosts(directory: Path, hosts: str) -> None:
    staged = directory / "hosts.new"
    staged.write_text(hosts)
    os.replace(staged, directory / "hosts")


def pod_processes(pid: int) -> list[int]:
    """The pod's process `pid` and every process it started, whatever their session (a supervisor
    starts its workload in a session of its own): what the cgroup freezer would stop (`docker pause`,
    a VM frozen for migration)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # after "pid (comm)": state, then ppid
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        process = todo.pop()
        found.append(process)
        todo.extend(children.get(process, []))
    return found
