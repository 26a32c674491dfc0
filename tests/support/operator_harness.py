"""The operator under test: the real kopf operator, in this process (on an event loop and thread of its
own, as in the operator's process: `KopfThread`), against the emulated API server.

`emulated_cluster()` starts the emulator (tests/support/cluster_emulator.py) and yields a `Kube` to act as a
user (apply, delete), as the scheduler, kubelet and node controller (bind a pod, set a pod's or
node's status, through the status subresource as they do), and to read the state; `operator()` runs
the operator against it until its block ends, its metrics served at `Kube.metrics_url`.

A failure in the test's own machinery fails the test at once, with its traceback: the emulator's
internal errors and the fake kubelet's (tests/support/fake_kubelet.py) are recorded with `Kube.fail` and
raised by the next `eventually` and when `emulated_cluster()` ends, instead of surfacing as a
timeout minutes later. Errors a restarting or busy API server causes are the kubelet's to tolerate
(`TRANSIENT_STATUSES`, connection errors); they are not failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import io
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import kopf
from slicekeeper.operator.cluster import Cluster, client_configuration
from slicekeeper.operator.handlers import register

from tests.support.cluster_emulator import TRAININGJOBS, ClusterEmulator
from tests.support.emulator_server import serving

JOBS_PATH = "/apis/slicekeeper.dev/v1alpha1/namespaces/{namespace}/trainingjobs"
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}
TRANSIENT_STATUSES = frozenset({404, 409, 429, 500, 502, 503, 504})
"""Answers a controller retries: the object went meanwhile (404), a conflict (409), the API server
busy or restarting (429, 5xx). Anything else (400, 415, 422) is a bug in whoever sent the request."""

OPERATOR_EXIT_SECONDS = 20.0
"""How long a stopped operator may take to exit (its timers' and informers' threads included)."""

WATCH_SECONDS = 10.0
"""Every watch of the emulated API server ends after this long (a real one's after 30 to 60 min): the
operator's watches reconnect many times in every test."""


class ApiError(AssertionError):
    """The emulated API server refused a request the test (or its kubelet) made."""

    def __init__(self, method: str, path: str, status: int, text: str) -> None:
        super().__init__(f"{method} {path}: {status} {text}")
        self.status = status


class Kube:
    def __init__(self, emulator: ClusterEmulator, url: str, session: aiohttp.ClientSession) -> None:
        self.emulator = emulator
        self.url = url
        self.session = session
        self.cluster: Cluster | None = None
        self.metrics_url = ""
        """The running operator's /metrics (on a free port of 127.0.0.1)."""
        self.failures: list[BaseException] = []

    def fail(self, error: BaseException) -> None:
        """Record a failure of the test's machinery: the test fails with it (see the module doc)."""
        self.failures.append(error)

    def check(self) -> None:
        """Raise the first failure recorded, the kubelet's or the emulator's own, if any."""
        for error in (*self.failures, *self.emulator.faults):
            raise error

    async def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> Any:
        """One request to the API server; its JSON answer, or ApiError for a status of 300 or more."""
        async with self.session.request(method, self.url + path, json=body, headers=headers) as response:
            text = await response.text()
            if response.status >= 300:
                raise ApiError(method, path, response.status, text)
            return await response.json() if text else None

    async def apply(self, job: dict[str, Any]) -> None:
        await self.request("POST", JOBS_PATH.format(namespace=job["metadata"]["namespace"]), job)

    async def delete_job(self, namespace: str, name: str) -> None:
        await self.request("DELETE", f"{JOBS_PATH.format(namespace=namespace)}/{name}")

    async def patch_job(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """As a user (`kubectl patch --type merge`): merge `patch` into the TrainingJob (its status
        is ignored there, as the API server ignores it: see `patch_job_status`)."""
        await self.request("PATCH", f"{JOBS_PATH.format(namespace=namespace)}/{name}", patch, MERGE_PATCH)

    async def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge `status` into the TrainingJob's status, through its status subresource."""
        path = f"{JOBS_PATH.format(namespace=namespace)}/{name}/status"
        await self.request("PATCH", path, {"status": status}, MERGE_PATCH)

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """As the kubelet or the scheduler: merge `patch` into the pod; its status through the status
        subresource (two writes when the patch has both)."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        await self._patch_with_status(path, patch)

    async def delete_pod(self, namespace: str, name: str) -> None:
        await self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")

    async def put_node(self, node: dict[str, Any]) -> None:
        """As the node controller: create the node (with its status, as a kubelet registers it), or
        merge `node` into it."""
        body = {"apiVersion": "v1", "kind": "Node", **node}
        try:
            await self.request("POST", "/api/v1/nodes", body)
        except ApiError as error:
            if error.status != 409:
                raise
            await self._patch_with_status(f"/api/v1/nodes/{node['metadata']['name']}", node)

    async def _patch_with_status(self, path: str, patch: dict[str, Any]) -> None:
        rest = {key: value for key, value in patch.items() if key != "status"}
        if rest:
            await self.request("PATCH", path, rest, MERGE_PATCH)
        if "status" in patch:
            await self.request("PATCH", f"{path}/status", {"status": patch["status"]}, MERGE_PATCH)

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


_current: contextvars.ContextVar[Kube] = contextvars.ContextVar("kube")
"""The cluster of the `emulated_cluster()` block the test is in, whose failures `eventually` raises."""


async def eventually(check: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
    """Wait until `check()` is truthy (returning it), or fail saying what was awaited; a failure of
    the emulated cluster's machinery (see the module doc) fails it at once."""
    kube = _current.get(None)
    deadline = time.monotonic() + timeout
    while True:
        if kube is not None:
            kube.check()
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what or check}")
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def operator(
    kube: Kube, *, concurrency: int | None = None, status_interval: float = 0.5
) -> AsyncIterator[Cluster]:
    """The real operator (kopf, our handlers) running against the emulator until the block ends;
    `concurrency`: its creates in flight (default: the operator's); `status_interval`: the seconds
    between its jobs' timer runs."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=kube.url, insecure=True)

    configuration = client_configuration(server=kube.url)
    cluster = (
        Cluster(configuration) if concurrency is None else Cluster(configuration, concurrency=concurrency)
    )
    register(registry, cluster, status_interval=status_interval)
    settings = kopf.OperatorSettings()
    settings.watching.reconnect_backoff = 0.1
    kopf_run = KopfThread(registry, settings)
    await asyncio.to_thread(kopf_run.started, 20)
    kube.cluster = cluster
    kube.metrics_url = f"http://127.0.0.1:{cluster.metrics.serve(0, '127.0.0.1')}/metrics"
    try:
        yield cluster
    finally:
        cluster.metrics.close()
        await asyncio.to_thread(kopf_run.stop, OPERATOR_EXIT_SECONDS)


class KopfThread:
    """kopf on an event loop of its own, in a thread, as the operator's process runs it: on the
    tests' loop, kopf took every task begun after its start for its own, the emulator's too, and
    waited 5 s for them at each exit (and answered SIGINT in the tests' stead)."""

    def __init__(self, registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings) -> None:
        self._registry, self._settings = registry, settings
        self._stop, self._ready = threading.Event(), threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kopf", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._task = self._loop.create_task(
                kopf.operator(
                    registry=self._registry,
                    settings=self._settings,
                    clusterwide=True,
                    standalone=True,
                    stop_flag=self._stop,
                    ready_flag=self._ready,
                )
            )
            self._loop.run_until_complete(self._task)
        except BaseException as error:  # (raised where the test stops the operator)
            self._error = error
        finally:
            self._loop.close()

    def started(self, timeout: float) -> None:
        if not self._ready.wait(timeout):
            self.stop(OPERATOR_EXIT_SECONDS)
            raise AssertionError(f"the operator was not ready within {timeout} s")

    def stop(self, timeout: float) -> None:
        """Stop kopf and wait for it to exit; what it still waits on if it does not."""
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            stuck = what_is_stuck(self._loop)
            if self._loop is not None and self._task is not None:
                self._loop.call_soon_threadsafe(self._task.cancel)
            raise AssertionError(f"the operator still ran {timeout} s after its stop:\n{stuck}")
        if self._error is not None:
            raise self._error


def what_is_stuck(loop: asyncio.AbstractEventLoop | None) -> str:
    """Every thread's stack and every pending task's of `loop`: what an operator that does not exit
    waits on."""
    lines: list[str] = []
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        lines.append(f"--- thread {names.get(ident, ident)}")
        lines.extend(traceback.format_stack(frame))
    for pending in asyncio.all_tasks(loop) if loop is not None else ():
        lines.append(f"--- task {pending.get_name()}")
        stack = io.StringIO()
        pending.print_stack(file=stack)
        lines.append(stack.getvalue())
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


@contextlib.asynccontextmanager
async def emulated_cluster(watch_seconds: float | None = WATCH_SECONDS) -> AsyncIterator[Kube]:
    """The emulated API server, its watches ending every `watch_seconds`; what its machinery recorded
    as failed is raised when the block ends (if the block did not raise first)."""
    # A connection per request: a kept-alive one can stall behind a stopping operator's streams.
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        ClusterEmulator() as emulator,
        serving(emulator),
        aiohttp.ClientSession(connector=connector) as session,
    ):
        emulator.watch_seconds = watch_seconds
        kube = Kube(emulator, str(emulator.url).rstrip("/"), session)
        token = _current.set(kube)
        try:
            yield kube
            kube.check()
        finally:
            _current.reset(token)
