"""The operator started the way the chart's Deployment starts it, as a process of this machine.

The command, the arguments and the environment are read from the Deployment the Helm engine renders
(tests/support/chart.py) for the values given, never written out here: a flag the chart passes that
the code no longer takes, or a port the chart names where the operator does not serve, fails the
test that uses it. Only what a pod gets from Kubernetes rather than from the chart is supplied here:
the API server (a kubeconfig naming the emulator, where a pod has its service account) and the
container image's PATH (the virtual environment's bin folder, where the image installs the console
script `slicekeeper`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support import chart

OPERATOR_DEPLOYMENT = "slicekeeper-operator"


@dataclass
class OperatorProcess:
    process: asyncio.subprocess.Process
    log: Path
    container: dict[str, Any]

    def port(self, name: str | int) -> int:
        """The container port the Deployment names `name` (healthz, metrics), or `name` if a number."""
        if isinstance(name, int):
            return name
        ports = [p["containerPort"] for p in self.container["ports"] if p.get("name") == name]
        assert len(ports) == 1, f"the Deployment's container has {len(ports)} ports named {name!r}"
        return int(ports[0])

    def tail(self) -> str:
        return self.log.read_text()[-3000:]

    async def stop(self) -> int:
        """SIGTERM, as the kubelet stops a container; its exit code."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.process.wait(), 30)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
            raise AssertionError(f"not stopped within 30 s of SIGTERM:\n{self.tail()}") from None


def deployment_container(values: dict[str, Any]) -> dict[str, Any]:
    deployment = chart.the("Deployment", OPERATOR_DEPLOYMENT, values)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def kubeconfig(path: Path, server: str) -> Path:
    """What the pod's service account gives the operator in a cluster: where the API server is."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": server}}],
        "users": [{"name": "operator", "user": {"token": "emulated"}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "operator"}}],
        "current-context": "emulator",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.asynccontextmanager
async def operator_as_deployed(
    server: str, values: dict[str, Any], where: Path
) -> AsyncIterator[OperatorProcess]:
    """The operator running with the command, args and env of the chart's Deployment (rendered with
    `values`) against the API server at `server`, until the block ends (then SIGTERM; it must stop)."""
    container = deployment_container(values)
    bin_folder = Path(sys.executable).parent
    executable = bin_folder / container["command"][0]
    assert executable.exists(), f"the Deployment's command {container['command'][0]!r} is not in {bin_folder}"
    env = {
        "PATH": f"{bin_folder}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(where),
        "KUBECONFIG": str(kubeconfig(where / "kubeconfig", server)),
        **{
            variable["name"]: variable["value"]
            for variable in container.get("env", [])
            if "value" in variable
        },
    }
    log = where / "operator.log"
    with log.open("w") as output:
        process = await asyncio.create_subprocess_exec(
            str(executable),
            *container["command"][1:],
            *container["args"],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    running = OperatorProcess(process, log, container)
    try:
        yield running
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
