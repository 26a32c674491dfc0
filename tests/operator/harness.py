"""The operator under test: the real kopf operator, in this process, against the emulated API server.

`running_operator()` starts the emulator and the operator and yields a `Kube` to act as a user
(apply, delete), as the scheduler and kubelet (set a pod's node and phase), and to read the state.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import kopf
from kmock._internal.apps import Server
from slicekeeper.operator.cluster import Cluster, client_configuration
from slicekeeper.operator.handlers import register

from tests.cluster_emulator import TRAININGJOBS, ClusterEmulator


class Kube:
    def __init__(self, emulator: ClusterEmulator, url: str, session: aiohttp.ClientSession) -> None:
        self.emulator = emulator
        self.url = url
        self.session = session
        self.cluster: Cluster | None = None

    async def apply(self, job: dict[str, Any]) -> None:
        namespace = job["metadata"]["namespace"]
        path = f"/apis/slicekeeper.dev/v1alpha1/namespaces/{namespace}/trainingjobs"
        async with self.session.post(self.url + path, json=job) as response:
            assert response.status < 300, await response.text()

    async def delete_job(self, namespace: str, name: str) -> None:
        path = f"/apis/slicekeeper.dev/v1alpha1/namespaces/{namespace}/trainingjobs/{name}"
        async with self.session.delete(self.url + path) as response:
            assert response.status < 300, await response.text()

    async def patch_job(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """As a user (`kubectl patch --type merge`): merge `patch` into the TrainingJob."""
        path = f"/apis/slicekeeper.dev/v1alpha1/namespaces/{namespace}/trainingjobs/{name}"
        headers = {"Content-Type": "application/merge-patch+json"}
        async with self.session.patch(self.url + path, json=patch, headers=headers) as response:
            assert response.status < 300, await response.text()

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """As the kubelet or the scheduler: merge `patch` into the pod."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        headers = {"Content-Type": "application/merge-patch+json"}
        async with self.session.patch(self.url + path, json=patch, headers=headers) as response:
            assert response.status < 300, await response.text()

    async def delete_pod(self, namespace: str, name: str) -> None:
        async with self.session.delete(f"{self.url}/api/v1/namespaces/{namespace}/pods/{name}") as response:
            assert response.status < 300, await response.text()

    async def put_node(self, node: dict[str, Any]) -> None:
        """As the node controller: create the node, or merge `node` into it."""
        name = node["metadata"]["name"]
        body = {"apiVersion": "v1", "kind": "Node", **node}
        async with self.session.post(f"{self.url}/api/v1/nodes", json=body) as response:
            if response.status < 300:
                return
        headers = {"Content-Type": "application/merge-patch+json"}
        async with self.session.patch(
            f"{self.url}/api/v1/nodes/{name}", json=node, headers=headers
        ) as response:
            assert response.status < 300, await response.text()

    def writes(self) -> list[tuple[str, str]]:
        """Every write request so far, oldest first: (resource plural, CREATE / UPDATE / DELETE)."""
        kinds = ("CREATE", "UPDATE", "DELETE")
        return [
            (request.resource.plural, request.action.name)
            for request in self.emulator._requests
            if request.resource is not None and request.action is not None and request.action.name in kinds
        ]

    def pods(self, namespace: str) -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in self.emulator.live("v1/pods", namespace)}

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        return next(j for j in self.emulator.live(TRAININGJOBS, namespace) if j["metadata"]["name"] == name)

    def events(self, namespace: str) -> list[dict[str, Any]]:
        return self.emulator.live("v1/events", namespace)


async def eventually(check: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
    """Wait until `check()` is truthy (returning it), or fail saying what was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what or check}")
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def operator(kube: Kube) -> AsyncIterator[Cluster]:
    """The real operator (kopf, our handlers) running against the emulator until the block ends."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=kube.url, insecure=True)

    cluster = Cluster(client_configuration(server=kube.url))
    register(registry, cluster, status_interval=0.5)
    settings = kopf.OperatorSettings()
    settings.watching.reconnect_backoff = 0.1
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        kopf.operator(
            registry=registry,
            settings=settings,
            clusterwide=True,
            standalone=True,
            stop_flag=stop,
            ready_flag=ready,
        )
    )
    await asyncio.wait_for(ready.wait(), 20)
    kube.cluster = cluster
    try:
        yield cluster
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


@contextlib.asynccontextmanager
async def emulated_cluster() -> AsyncIterator[Kube]:
    # A connection per request: a kept-alive one can stall behind a stopping operator's streams.
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        ClusterEmulator() as emulator,
        Server(emulator),
        aiohttp.ClientSession(connector=connector) as session,
    ):
        yield Kube(emulator, str(emulator.url).rstrip("/"), session)
