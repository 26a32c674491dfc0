"""Scale benchmark of the operator: jobs of 64, 1,000 and 25,000 TPU hosts against the emulated API server.

Why it exists: the operator creates one pod per TPU host and watches every one of them. A job of
25,000 hosts (100k chips) must not cost the API server or the operator more per pod than a small
one, a single-host hot-swap must cost a handful of API writes whatever the job's size, and the
operator must render and submit such a job without holding it in memory. The unit and operator tests
use 4-host jobs, where none of that shows.

How: the emulated API server of the operator's tests (tests/support/cluster_emulator.py: kmock's
KubernetesEmulator plus what kopf needs) runs in this process; the operator runs in its own process,
as deployed (`slicekeeper operator --server URL --liveness URL`), so its memory is its own. It
serves every namespace: with `--namespace`, kopf lists `/api/v1/namespaces`, a path kmock cannot
parse (the operator stops on the 500). Per job size, a fresh emulator and operator:

1. the operator starts and opens its watches; a TrainingJob of `hosts` hosts is applied (one POST);
2. **time to all pods**: seconds from the apply until every pod of the job exists in the emulator;
   **requests per pod** and **writes per pod**: the operator's API requests (all of them: lists,
   watches, creates, patches, events), and its writes (creates, patches, deletes) alone, in that
   window, divided by the number of pods; the CPU both processes used meanwhile (which one is the
   bottleneck);
3. settle: the operator's reconciliation is done (its `Created` event and `status.slicesTotal`) and
   it has written nothing but the job's status for a few seconds; the scheduler's part is played by
   binding one pod to a node (a merge patch of `spec.nodeName`), then it settles again;
4. **hot-swap writes**: that pod is marked `Failed` with a merge patch of `status.phase`, as the
   kubelet would; the window ends when the replacement pod exists (same name, new uid), both
   `HotSwap` events are posted, the job's `status.restarts.replace` is 1 and the operator has written
   nothing but the job's status for a few seconds. Every write the operator made in that window is
   counted (our own patches are not: they carry our User-Agent), the periodic status patches that
   fell into it included;
5. **steady state**: `--idle` seconds of nothing happening: the operator's CPU share and its API
   requests, which is what the periodic status timer costs at that size;
6. **operator peak memory**: the operator process's VmHWM (peak resident set, from
   /proc/PID/status), once all pods exist (rendered and submitted), and after the hot-swap and the
   steady state (the whole run);
7. **cleanup** (unless `--no-delete`): the job is deleted; seconds until the operator's finalizer has
   deleted every pod and the job is gone, and the operator's peak memory after it;
8. **restart** (unless `--restart-timeout 0`): the job is applied again, and once its pods exist the
   operator is stopped and a fresh one started: seconds until it serves the job again (its first
   status patch, written by the resume handler once it has read the job's pods: kopf runs no handler
   before its index of TrainingJobs is filled), and its peak memory. Given up after
   `--restart-timeout` seconds.

Job shapes: v5p hosts carry 4 chips; a size of N hosts runs N / h slices of h hosts (v5p-(8h)), h the
largest power of two up to 16 that divides N: 64 = 4 x 16 (v5p-128), 1,000 = 125 x 8 (v5p-64),
25,000 = 3,125 x 8 (v5p-64, 100k chips).

Targets: a single-host hot-swap costs at most 10 API writes, whatever the job size; a 25,000-host job
is rendered and submitted with the operator's peak memory under 1 GiB.

    .venv/bin/python -m benchmarks.operator_scale [--sizes 64,1000,25000] [--idle 30] [--json FILE]
        [--no-delete] [--restart-timeout 300] [--keep-logs DIR]

Run it as a module from the repo root (as above): it imports the emulator from the test suite
(`tests.support`), which the repo root on sys.path makes importable.

The emulator shares this process's event loop with the benchmark's own bookkeeping, which is kept
cheap (a running count of pods; the request log read only over a phase's window) so that the
benchmark never walks 25,000 objects while the operator waits for an answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from resource import RUSAGE_SELF
from resource import getrusage as resource_usage
from typing import Any

import aiohttp
import yaml
from kmock import resource
from kmock._internal import enums, rendering
from kmock._internal.apps import Server

from slicekeeper.api import parse_training_job
from tests.support.cluster_emulator import TRAININGJOBS, ClusterEmulator

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "trainingjob.yaml"
NAMESPACE = "bench"
DEFAULT_SIZES = (64, 1000, 25000)
CHIPS_PER_HOST = 4  # v5p
MAX_HOSTS_PER_SLICE = 16

HOT_SWAP_TARGET_WRITES = 10
MEMORY_TARGET_MIB = 1024.0
MEMORY_TARGET_HOSTS = 25000

USER_AGENT = "slicekeeper-operator-scale-benchmark"
"""Our own requests (the apply, the scheduler's and the kubelet's patches) carry this, and are left out."""
WRITES = (enums.action.CREATE, enums.action.UPDATE, enums.action.DELETE)
PODS = resource("v1/pods")
EVENTS = resource("v1/events")
JOBS = resource(TRAININGJOBS)
PROGRESS_SECONDS = 10.0
QUIET_SECONDS = 3.0
"""Settled: the operator wrote nothing but its job's status for this long."""


# --- the job --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    tpu_type: str
    slices: int
    hosts_per_slice: int

    @property
    def hosts(self) -> int:
        return self.slices * self.hosts_per_slice


def shape_for(hosts: int) -> Shape:
    """`hosts` 4-chip v5p hosts as slices of the largest power-of-two host count up to 16 dividing it."""
    per_slice = 1
    while per_slice * 2 <= MAX_HOSTS_PER_SLICE and hosts % (per_slice * 2) == 0:
        per_slice *= 2
    return Shape(f"v5p-{2 * CHIPS_PER_HOST * per_slice}", hosts // per_slice, per_slice)


def job_manifest(shape: Shape) -> dict[str, Any]:
    """The example TrainingJob, resized to `shape`, in the benchmark's namespace."""
    job: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    job["metadata"] = {"name": f"scale-{shape.hosts}", "namespace": NAMESPACE}
    job["spec"]["tpu"] = {"type": shape.tpu_type}
    job["spec"]["slices"] = shape.slices
    job["spec"].pop("local", None)  # the local runtime's settings: no part of the cluster's job
    model = parse_training_job(job, "the benchmark's job")
    if model.total_hosts != shape.hosts or model.slice_shape.chips_per_host != CHIPS_PER_HOST:
        raise SystemExit(f"{shape} renders {model.total_hosts} hosts, not {shape.hosts}")
    return job


# --- the emulator, with running counts ------------------------------------------------------------
class BenchEmulator(ClusterEmulator):
    """The tests' emulator, counting the pods that exist and timing every request as it arrives."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.live_pods = 0
        self.arrivals: dict[int, float] = {}

    async def _handle(self, request: rendering.Request) -> Any:
        self.arrivals[request.id] = time.monotonic()
        response = await super()._handle(request)  # raises on 404 / 409: nothing changed
        if request.resource == PODS and request.namespace == NAMESPACE:
            if request.action == enums.action.CREATE:
                self.live_pods += 1
            elif request.action == enums.action.DELETE:
                self.live_pods -= 1
        return response

    def pod(self, name: str) -> dict[str, Any] | None:
        key = (PODS, NAMESPACE, name)
        return dict(self.objects[key].raw) if key in self.objects and not self.objects[key].deleted else None

    def job(self, name: str) -> dict[str, Any]:
        return dict(self.objects[(JOBS, NAMESPACE, name)].raw)

    def job_exists(self, name: str) -> bool:
        key = (JOBS, NAMESPACE, name)
        return key in self.objects and not self.objects[key].deleted


@dataclass
class Tally:
    """The operator's API requests in a window [start, end) of the emulator's request log (end 0: to now)."""

    emulator: BenchEmulator
    start: int
    end: int = 0

    def requests(self) -> list[rendering.Request]:
        return [
            r
            for r in self.emulator._requests[self.start : self.end or None]
            if r.headers.get("User-Agent") != USER_AGENT
        ]

    def writes(self) -> list[rendering.Request]:
        return [r for r in self.requests() if r.action in WRITES]


def describe(request: rendering.Request) -> str:
    """'pods CREATE', 'trainingjobs/status UPDATE', 'GET /apis' (discovery), ..."""
    if request.resource is None or request.resource.plural is None or request.action is None:
        return f"{request.method.value} {request.url.path}"
    what = request.resource.plural
    if request.subresource:
        what = f"{what}/{request.subresource}"
    return f"{what} {request.action.name}"


def last_write_age(
    emulator: BenchEmulator, since: int, since_time: float, ignore: Callable[[rendering.Request], bool]
) -> float:
    """Seconds since the operator's last write after request `since` (made at `since_time` or later)
    that `ignore` does not exclude; since `since_time` if there was none."""
    requests = emulator._requests
    last = since_time
    for index in range(len(requests) - 1, since - 1, -1):
        request = requests[index]
        ours = request.headers.get("User-Agent") == USER_AGENT
        if request.action in WRITES and not ours and not ignore(request):
            last = max(last, emulator.arrivals.get(index, since_time))
            break
    return time.monotonic() - last


def is_job_status_patch(request: rendering.Request) -> bool:
    return request.resource == JOBS and request.action == enums.action.UPDATE


# --- the operator's process -----------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def proc_status_kib(pid: int, key: str) -> int:
    """A `kB` field of /proc/PID/status (VmHWM: peak resident set; VmRSS: now)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise KeyError(key)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource_usage(RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def mib(kib: int) -> float:
    return kib / 1024


@contextlib.asynccontextmanager
async def running_operator(url: str, log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    port = free_port()
    with log.open("w") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "slicekeeper.cli", "operator", "--server", url,
            "--liveness", f"http://127.0.0.1:{port}/healthz", stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            yield process
        finally:
            if process.returncode is None:
                process.terminate()
                try:
                    await asyncio.wait_for(process.wait(), 30)
                except TimeoutError:
                    process.kill()
                    await process.wait()


async def wait_for(
    check: Callable[[], Any], timeout: float, what: str, progress: Callable[[], str] | None = None
) -> Any:
    """Wait until `check()` is truthy (returning it), printing `progress()` every so often."""
    started = last = time.monotonic()
    while True:
        result = check()
        if result:
            return result
        now = time.monotonic()
        if now - started > timeout:
            raise TimeoutError(f"not within {timeout:.0f} s: {what}")
        if progress is not None and now - last >= PROGRESS_SECONDS:
            last = now
            print(f"    {now - started:6.0f} s  {progress()}", flush=True)
        await asyncio.sleep(0.1)


# --- one size -------------------------------------------------------------------------------------
@dataclass
class Figures:
    hosts: int
    tpu_type: str
    slices: int
    hosts_per_slice: int
    seconds_to_all_pods: float = 0.0
    pods_per_second: float = 0.0
    requests_per_pod: float = 0.0
    writes_per_pod: float = 0.0
    creation_requests: dict[str, int] = field(default_factory=dict)
    creation_operator_cpu_share: float = 0.0
    """Operator CPU seconds per second while the pods were created (1.0 = one core busy)."""
    creation_emulator_cpu_share: float = 0.0
    """The same for this process: the emulated API server (and the benchmark's bookkeeping)."""
    hot_swap_writes: int = 0
    hot_swap_breakdown: dict[str, int] = field(default_factory=dict)
    hot_swap_seconds: float = 0.0
    """Failed patch -> replacement pod exists."""
    idle_seconds: float = 0.0
    idle_cpu_share: float = 0.0
    """Operator CPU seconds per second of nothing happening (1.0 = one core busy)."""
    idle_requests_per_minute: float = 0.0
    idle_writes_per_minute: float = 0.0
    idle_requests: dict[str, int] = field(default_factory=dict)
    operator_idle_mib: float = 0.0
    """VmHWM after start-up, before the job."""
    operator_peak_mib_submitted: float = 0.0
    """VmHWM once every pod exists."""
    operator_peak_mib: float = 0.0
    """VmHWM at the end of the run (before the restart)."""
    delete_seconds: float = 0.0
    """The job deleted -> its pods and the job itself gone (the finalizer's cleanup)."""
    delete_requests_per_pod: float = 0.0
    delete_requests: dict[str, int] = field(default_factory=dict)
    operator_peak_mib_deleted: float = 0.0
    """VmHWM once the job is gone: the whole run, the cleanup included."""
    restart_seconds: float = 0.0
    """A fresh operator started -> it has resumed the job (its first status patch); or gave up."""
    restart_resumed: bool = False
    restart_writes: int = 0
    restart_requests: dict[str, int] = field(default_factory=dict)
    operator_peak_mib_restart: float = 0.0
    """VmHWM of the restarted operator, once settled: its start-up listing of every pod included."""
    emulator_rss_mib: float = 0.0
    """This process (emulator and benchmark) at the end, for reference."""


def breakdown(requests: list[rendering.Request]) -> dict[str, int]:
    return dict(sorted(Counter(describe(r) for r in requests).items()))


class Run:
    """One job size against one emulator: the operator (and its restart), the job, the faults."""

    def __init__(self, emulator: BenchEmulator, session: aiohttp.ClientSession, shape: Shape, logs: Path):
        self.emulator = emulator
        self.session = session
        self.url = str(emulator.url).rstrip("/")
        self.shape = shape
        self.job = job_manifest(shape)
        self.name: str = self.job["metadata"]["name"]
        self.logs = logs
        self.figures = Figures(shape.hosts, shape.tpu_type, shape.slices, shape.hosts_per_slice)
        self.settle_timeout = 120 + 0.01 * shape.hosts

    # -- helpers ------------------------------------------------------------------------------------
    async def patch_pod(self, pod: str, patch: dict[str, Any]) -> None:
        """As the scheduler or the kubelet: a merge patch of one pod, its status through `/status`
        (a write to the pod itself ignores the status, as on a real API server)."""
        headers = {"Content-Type": "application/merge-patch+json"}
        path = f"{self.url}/api/v1/namespaces/{NAMESPACE}/pods/{pod}"
        rest = {key: value for key, value in patch.items() if key != "status"}
        writes = [(path, rest)] if rest else []
        if "status" in patch:
            writes.append((f"{path}/status", {"status": patch["status"]}))
        for url, body in writes:
            async with self.session.patch(url, json=body, headers=headers) as response:
                assert response.status < 300, await response.text()

    def since(self, start: int) -> list[rendering.Request]:
        return self.emulator._requests[start:]

    async def operator_up(self, process: asyncio.subprocess.Process, start: int, log: Path) -> None:
        """Wait until the operator (started when the log held `start` requests) watches jobs and pods."""

        def watching() -> bool:
            if process.returncode is not None:
                raise RuntimeError(f"the operator exited ({process.returncode}); see {log}")
            watched = {r.resource for r in self.since(start) if r.action == enums.action.WATCH}
            return {JOBS, PODS} <= watched

        await wait_for(watching, 60 + 0.01 * self.shape.hosts, "the operator watching TrainingJobs and pods")

    async def settled(self, start: int, what: str) -> None:
        """Wait until the operator has written nothing but its job's status for QUIET_SECONDS."""
        since_time = time.monotonic()

        def quiet() -> bool:
            return last_write_age(self.emulator, start, since_time, is_job_status_patch) >= QUIET_SECONDS

        await wait_for(quiet, self.settle_timeout, what)

    def job_status(self) -> dict[str, Any]:
        return dict(self.emulator.job(self.name).get("status") or {})

    # -- the phases ---------------------------------------------------------------------------------
    async def create(self, process: asyncio.subprocess.Process, log: Path, record: bool = True) -> None:
        """Apply the job; wait for every pod; the requests it took (into the figures if `record`)."""
        f, emulator, pid = self.figures, self.emulator, process.pid
        tally = Tally(emulator, start=len(emulator._requests))
        path = f"{self.url}/apis/slicekeeper.dev/v1alpha1/namespaces/{NAMESPACE}/trainingjobs"
        cpu_before = (cpu_seconds(pid), own_cpu_seconds())
        started = time.monotonic()
        async with self.session.post(path, json=self.job) as response:
            assert response.status < 300, await response.text()

        def progress() -> str:
            elapsed = time.monotonic() - started
            rss = mib(proc_status_kib(pid, "VmRSS")) if process.returncode is None else 0.0
            return (
                f"{emulator.live_pods:6d} / {self.shape.hosts} pods ({emulator.live_pods / elapsed:4.0f}/s),"
                f" operator RSS {rss:4.0f} MiB"
            )

        def all_pods() -> bool:
            if process.returncode is not None:
                raise RuntimeError(f"the operator exited ({process.returncode}); see {log}")
            return emulator.live_pods >= self.shape.hosts

        await wait_for(all_pods, 120 + 0.2 * self.shape.hosts, "every pod", progress)
        if not record:
            print(f"    all {self.shape.hosts} pods again in {time.monotonic() - started:.1f} s", flush=True)
            await self.settled(len(emulator._requests), "the operator settled after the creation")
            return
        f.seconds_to_all_pods = time.monotonic() - started
        f.creation_operator_cpu_share = (cpu_seconds(pid) - cpu_before[0]) / f.seconds_to_all_pods
        f.creation_emulator_cpu_share = (own_cpu_seconds() - cpu_before[1]) / f.seconds_to_all_pods
        f.operator_peak_mib_submitted = mib(proc_status_kib(pid, "VmHWM"))
        tally.end = len(emulator._requests)
        requests = tally.requests()
        f.pods_per_second = self.shape.hosts / f.seconds_to_all_pods
        f.requests_per_pod = len(requests) / self.shape.hosts
        f.writes_per_pod = len(tally.writes()) / self.shape.hosts
        f.creation_requests = breakdown(requests)
        print(
            f"    all {self.shape.hosts} pods in {f.seconds_to_all_pods:.1f} s; CPU: operator"
            f" {100 * f.creation_operator_cpu_share:.0f} %, emulator"
            f" {100 * f.creation_emulator_cpu_share:.0f} % of a core; operator peak"
            f" {f.operator_peak_mib_submitted:.0f} MiB; requests {f.creation_requests}",
            flush=True,
        )

        # The reconciliation is over when its Created event is posted and the status has slicesTotal.
        def reconciled() -> bool:
            return bool(self.job_status().get("slicesTotal")) and any(
                r.resource == EVENTS and r.action == enums.action.CREATE and r.data.get("reason") == "Created"
                for r in self.since(tally.start)
            )

        await wait_for(reconciled, self.settle_timeout, "the Created event and status.slicesTotal")
        await self.settled(tally.end, "the operator settled after the creation")

    async def hot_swap(self) -> None:
        """Bind one pod to a node, then fail it as the kubelet would; the operator's writes until it is
        replaced and everything is quiet again."""
        f, emulator = self.figures, self.emulator
        victim = f"{self.name}-s{self.shape.slices // 2}-w{self.shape.hosts_per_slice // 2}"
        await self.patch_pod(victim, {"spec": {"nodeName": "tpu-node-bench"}})  # the scheduler
        await self.settled(len(emulator._requests), "the operator settled after the binding")
        old = emulator.pod(victim)
        assert old is not None
        swap = Tally(emulator, start=len(emulator._requests))
        started = time.monotonic()
        await self.patch_pod(victim, {"status": {"phase": "Failed", "reason": "Evicted"}})  # the kubelet

        def replaced() -> bool:
            pod = emulator.pod(victim)
            return pod is not None and pod["metadata"]["uid"] != old["metadata"]["uid"]

        await wait_for(replaced, self.settle_timeout, f"a replacement for {victim}")
        f.hot_swap_seconds = time.monotonic() - started

        def done() -> bool:
            events = [
                r
                for r in self.since(swap.start)
                if r.resource == EVENTS
                and r.action == enums.action.CREATE
                and r.data.get("reason") == "HotSwap"
            ]
            return len(events) >= 2 and (self.job_status().get("restarts") or {}).get("replace") == 1

        await wait_for(done, self.settle_timeout, "both HotSwap events and status.restarts.replace = 1")
        await self.settled(swap.start, "the operator settled after the hot-swap")
        swap.end = len(emulator._requests)
        writes = swap.writes()
        f.hot_swap_writes = len(writes)
        f.hot_swap_breakdown = breakdown(writes)
        print(
            f"    hot-swap: {len(writes)} writes {f.hot_swap_breakdown},"
            f" replacement after {f.hot_swap_seconds:.2f} s",
            flush=True,
        )

    async def delete(self, process: asyncio.subprocess.Process, log: Path) -> None:
        """Delete the job: the operator's finalizer deletes every pod, the Service and the ConfigMap."""
        f, emulator, pid = self.figures, self.emulator, process.pid
        tally = Tally(emulator, start=len(emulator._requests))
        path = f"{self.url}/apis/slicekeeper.dev/v1alpha1/namespaces/{NAMESPACE}/trainingjobs/{self.name}"
        started = time.monotonic()
        async with self.session.delete(path) as response:
            assert response.status < 300, await response.text()

        def gone() -> bool:
            if process.returncode is not None:
                raise RuntimeError(f"the operator exited ({process.returncode}); see {log}")
            return emulator.live_pods == 0 and not emulator.job_exists(self.name)

        def progress() -> str:
            rss, peak = mib(proc_status_kib(pid, "VmRSS")), mib(proc_status_kib(pid, "VmHWM"))
            return f"{emulator.live_pods:6d} pods left, operator RSS {rss:4.0f} MiB, peak {peak:4.0f} MiB"

        await wait_for(gone, 120 + 0.2 * self.shape.hosts, "every pod and the job gone", progress)
        f.delete_seconds = time.monotonic() - started
        await self.settled(tally.start, "the operator settled after the deletion")
        tally.end = len(emulator._requests)
        f.delete_requests_per_pod = len(tally.requests()) / self.shape.hosts
        f.delete_requests = breakdown(tally.requests())
        f.operator_peak_mib_deleted = mib(proc_status_kib(pid, "VmHWM"))
        print(
            f"    deleted: pods and job gone after {f.delete_seconds:.1f} s; operator peak"
            f" {f.operator_peak_mib_deleted:.0f} MiB; requests {f.delete_requests}",
            flush=True,
        )

    async def steady_state(self, pid: int, seconds: float) -> None:
        f = self.figures
        tally = Tally(self.emulator, start=len(self.emulator._requests))
        cpu_before, started = cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(seconds)
        f.idle_seconds = time.monotonic() - started
        f.idle_cpu_share = (cpu_seconds(pid) - cpu_before) / f.idle_seconds
        tally.end = len(self.emulator._requests)
        f.idle_requests_per_minute = len(tally.requests()) * 60 / f.idle_seconds
        f.idle_writes_per_minute = len(tally.writes()) * 60 / f.idle_seconds
        f.idle_requests = breakdown(tally.requests())
        print(
            f"    steady state over {f.idle_seconds:.0f} s: operator CPU {100 * f.idle_cpu_share:.0f} % of"
            f" a core, requests {f.idle_requests}",
            flush=True,
        )

    async def restart(self, timeout: float) -> None:
        """A fresh operator: how long until it has resumed the job, what it wrote, its peak memory.
        The first status patch comes from the resume handler, once it has read the job's pods (kopf
        runs no handler before its indexes are filled): the operator is serving the job again."""
        f, emulator = self.figures, self.emulator
        log = self.logs / f"operator-{self.shape.hosts}-restart.log"
        start = len(emulator._requests)
        started = time.monotonic()
        async with running_operator(self.url, log) as process:
            pid = process.pid

            def resumed() -> bool:
                if process.returncode is not None:
                    raise RuntimeError(f"the restarted operator exited ({process.returncode}); see {log}")
                return any(is_job_status_patch(r) for r in self.since(start))

            def progress() -> str:
                return (
                    f"restarted operator: RSS {mib(proc_status_kib(pid, 'VmRSS')):4.0f} MiB,"
                    f" peak {mib(proc_status_kib(pid, 'VmHWM')):4.0f} MiB, CPU {cpu_seconds(pid):5.0f} s"
                )

            try:
                await wait_for(resumed, timeout, "the restarted operator's first status patch", progress)
                f.restart_seconds = time.monotonic() - started
                await self.settled(start, "the restarted operator settled")
                f.restart_resumed = True
            except TimeoutError as error:
                f.restart_seconds = time.monotonic() - started
                print(f"    restart: {error}", flush=True)
            tally = Tally(emulator, start=start, end=len(emulator._requests))
            f.restart_writes = len(tally.writes())
            f.restart_requests = breakdown(tally.requests())
            f.operator_peak_mib_restart = mib(proc_status_kib(pid, "VmHWM"))
        print(
            f"    restart: {'resumed after' if f.restart_resumed else 'NOT resumed after'}"
            f" {f.restart_seconds:.1f} s, peak {f.operator_peak_mib_restart:.0f} MiB,"
            f" requests {f.restart_requests}",
            flush=True,
        )


async def measure(hosts: int, idle: float, delete: bool, restart_timeout: float, logs: Path) -> Figures:
    shape = shape_for(hosts)
    print(
        f"\n== {shape.hosts} hosts: {shape.slices} x {shape.tpu_type} ({shape.hosts_per_slice} hosts each),"
        f" {shape.hosts * CHIPS_PER_HOST} chips",
        flush=True,
    )
    # A connection per request: a kept-alive one can stall behind a stopping operator's streams.
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        BenchEmulator() as emulator,
        Server(emulator),
        aiohttp.ClientSession(connector=connector, headers={"User-Agent": USER_AGENT}) as session,
    ):
        run = Run(emulator, session, shape, logs)
        f = run.figures
        log = logs / f"operator-{shape.hosts}.log"
        async with running_operator(run.url, log) as process:
            await run.operator_up(process, 0, log)
            await asyncio.sleep(1.0)
            f.operator_idle_mib = mib(proc_status_kib(process.pid, "VmHWM"))
            await run.create(process, log)
            await run.hot_swap()
            if idle > 0:
                await run.steady_state(process.pid, idle)
            f.operator_peak_mib = mib(proc_status_kib(process.pid, "VmHWM"))
            print(
                f"    operator peak memory: {f.operator_peak_mib_submitted:.0f} MiB once submitted,"
                f" {f.operator_peak_mib:.0f} MiB over the run (idle before the job:"
                f" {f.operator_idle_mib:.0f} MiB)",
                flush=True,
            )
            if delete:
                await run.delete(process, log)
                if restart_timeout > 0:  # the restart needs the job's pods: the job again
                    await run.create(process, log, record=False)
        if restart_timeout > 0:
            await run.restart(restart_timeout)
        f.emulator_rss_mib = mib(proc_status_kib(os.getpid(), "VmRSS"))
    return f


# --- report ---------------------------------------------------------------------------------------
def restart_cell(f: Figures) -> str:
    if not f.restart_seconds:
        return "-"
    return f"{f.restart_seconds:.1f} s" if f.restart_resumed else f"> {f.restart_seconds:.0f} s"


COLUMNS: list[tuple[str, Callable[[Figures], str]]] = [
    ("hosts", lambda f: f"{f.hosts:,}"),
    ("job", lambda f: f"{f.slices:,} x {f.tpu_type}"),
    ("time to all pods", lambda f: f"{f.seconds_to_all_pods:.1f} s"),
    ("pods/s", lambda f: f"{f.pods_per_second:.0f}"),
    ("requests/pod", lambda f: f"{f.requests_per_pod:.3f}"),
    ("writes/pod", lambda f: f"{f.writes_per_pod:.3f}"),
    ("hot-swap writes", lambda f: str(f.hot_swap_writes)),
    ("operator peak: submitted", lambda f: f"{f.operator_peak_mib_submitted:.0f} MiB"),
    ("whole run", lambda f: f"{f.operator_peak_mib:.0f} MiB"),
    ("deleted after", lambda f: f"{f.delete_seconds:.1f} s" if f.delete_seconds else "-"),
    ("cleanup: peak", lambda f: f"{f.operator_peak_mib_deleted:.0f} MiB" if f.delete_seconds else "-"),
    ("restart: peak", lambda f: f"{f.operator_peak_mib_restart:.0f} MiB" if f.restart_seconds else "-"),
    ("resumed after", restart_cell),
    ("idle CPU", lambda f: f"{100 * f.idle_cpu_share:.0f} %" if f.idle_seconds else "-"),
]


def table(results: list[Figures]) -> str:
    """A Markdown table, one row per size."""
    rows = [[title for title, _ in COLUMNS], *([cell(f) for _, cell in COLUMNS] for f in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]

    def line(cells: list[str]) -> str:
        aligned = [
            c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(aligned) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(rows[0]), rule, *(line(row) for row in rows[1:])])


def targets(results: list[Figures]) -> list[str]:
    lines = []
    worst = max(results, key=lambda f: f.hot_swap_writes)
    met = worst.hot_swap_writes <= HOT_SWAP_TARGET_WRITES
    lines.append(
        f"hot-swap <= {HOT_SWAP_TARGET_WRITES} API writes at every size: {'met' if met else 'MISSED'}"
        f" (at most {worst.hot_swap_writes}, at {worst.hosts} hosts)"
    )
    big = [f for f in results if f.hosts >= MEMORY_TARGET_HOSTS]
    if big:
        peak = max(f.operator_peak_mib_submitted for f in big)
        met = peak < MEMORY_TARGET_MIB
        lines.append(
            f"{MEMORY_TARGET_HOSTS}-host job submitted with operator peak < {MEMORY_TARGET_MIB:.0f} MiB:"
            f" {'met' if met else 'MISSED'} ({peak:.0f} MiB)"
        )
    else:
        lines.append(f"memory target: not measured (needs a size of {MEMORY_TARGET_HOSTS} hosts)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--sizes",
        default=",".join(map(str, DEFAULT_SIZES)),
        help="comma-separated job sizes in TPU hosts (default: %(default)s)",
    )
    parser.add_argument(
        "--idle",
        type=float,
        default=30.0,
        help="seconds of steady state measured after the hot-swap (default: %(default)s; 0: none)",
    )
    parser.add_argument("--no-delete", action="store_true", help="skip the deletion of the job")
    parser.add_argument(
        "--restart-timeout",
        type=float,
        default=300.0,
        help="restart the operator with the job's pods there, and wait this long for it to resume the job"
        " (default: %(default)s s; 0: no restart)",
    )
    parser.add_argument("--json", type=Path, help="save the figures here")
    parser.add_argument("--keep-logs", type=Path, help="keep the operator's logs in this folder")
    args = parser.parse_args(argv)
    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    results: list[Figures] = []
    with tempfile.TemporaryDirectory(prefix="operator-scale-") as tmp:
        workdir = args.keep_logs or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for hosts in sizes:
            results.append(
                asyncio.run(measure(hosts, args.idle, not args.no_delete, args.restart_timeout, workdir))
            )
    print()
    print(table(results))
    print()
    for line in targets(results):
        print(line)
    if args.json is not None:
        document = {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "results": [asdict(f) for f in results],
            "targets": targets(results),
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
