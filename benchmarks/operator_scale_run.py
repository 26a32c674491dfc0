"""One job size of the operator scale benchmark (benchmarks/operator_scale.py) against one emulator: the
phases of a run (creation, hot-swap, steady state, deletion, restart), each filling in its figures.

The biggest part of the benchmark, apart from its entry point so that each stays short.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
from kmock._internal import enums, rendering

from benchmarks.operator_scale_emulator import (
    EVENTS,
    JOBS,
    BenchEmulator,
    Tally,
    breakdown,
    is_job_status_patch,
    last_write_age,
)
from benchmarks.operator_scale_figures import Figures
from benchmarks.operator_scale_job import NAMESPACE, Shape, job_manifest
from benchmarks.operator_scale_process import (
    cpu_seconds,
    mib,
    own_cpu_seconds,
    proc_status_kib,
    running_operator,
    wait_for,
)

QUIET_SECONDS = 3.0
"""Settled: the operator wrote nothing but its job's status for this long."""


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
        """Wait until the operator (started when the log held `start` requests) watches TrainingJobs (it
        watches the jobs' pods from its first job handler on: operator/pod_informers.py)."""

        def watching() -> bool:
            if process.returncode is not None:
                raise RuntimeError(f"the operator exited ({process.returncode}); see {log}")
            watched = {r.resource for r in self.since(start) if r.action == enums.action.WATCH}
            return JOBS in watched

        await wait_for(watching, 60 + 0.01 * self.shape.hosts, "the operator watching TrainingJobs")

    async def settled(self, start: int, what: str) -> None:
        """Wait until the operator has written nothing but its job's status for QUIET_SECONDS."""
        since_time = time.monotonic()

        def quiet() -> bool:
            return last_write_age(self.emulator, start, since_time, is_job_status_patch) >= QUIET_SECONDS

        await wait_for(quiet, self.settle_timeout, what)

    def job_status(self) -> dict[str, Any]:
        return dict(self.emulator.job(self.name).get("status") or {})

    # -- the phases ---------------------------------------------------------------------------------
    async def create(self, process: asyncio.subprocess.Process, log: Path, record: bool = True) -> float:
        """Apply the job; wait for every pod; the requests it took (into the figures if `record`); the
        seconds from the apply to the last pod."""
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
            seconds = time.monotonic() - started
            operator_cpu, emulator_cpu = cpu_seconds(pid) - cpu_before[0], own_cpu_seconds() - cpu_before[1]
            print(
                f"    all {self.shape.hosts} pods again in {seconds:.1f} s (the emulator answering"
                f" {1000 * emulator.latency:.0f} ms late); CPU: operator"
                f" {100 * operator_cpu / seconds:.0f} %, emulator {100 * emulator_cpu / seconds:.0f} % of a"
                f" core, operator"
                f" {1000 * operator_cpu / self.shape.hosts:.2f} ms a pod",
                flush=True,
            )
            await self.settled(len(emulator._requests), "the operator settled after the creation")
            return seconds
        f.seconds_to_all_pods = time.monotonic() - started
        f.cpu_ms_per_pod = 1000 * (cpu_seconds(pid) - cpu_before[0]) / self.shape.hosts
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
        return f.seconds_to_all_pods

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
            return len(events) >= 1 and (self.job_status().get("restarts") or {}).get("replace") == 1

        await wait_for(done, self.settle_timeout, "the HotSwap event and status.restarts.replace = 1")
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
        # The last pod of the job (the last kopf's listing reaches) fails while no operator runs.
        victim = f"{self.name}-s{self.shape.slices - 1}-w{self.shape.hosts_per_slice - 1}"
        failed = emulator.pod(victim)
        assert failed is not None
        await self.patch_pod(victim, {"spec": {"nodeName": "tpu-node-bench"}})
        await self.patch_pod(victim, {"status": {"phase": "Failed", "reason": "Evicted"}})
        start = len(emulator._requests)
        started = time.monotonic()

        def replaced() -> bool:
            pod = emulator.pod(victim)
            if pod is not None and pod["metadata"]["uid"] != failed["metadata"]["uid"]:
                f.restart_replaced_seconds = f.restart_replaced_seconds or time.monotonic() - started
            return bool(f.restart_replaced_seconds)

        async with running_operator(self.url, log) as process:
            pid = process.pid

            def resumed() -> bool:
                if process.returncode is not None:
                    raise RuntimeError(f"the restarted operator exited ({process.returncode}); see {log}")
                return any(is_job_status_patch(r) for r in self.since(start))

            def serving() -> bool:
                replaced()  # (timed whenever it comes first)
                return resumed()

            def progress() -> str:
                return (
                    f"restarted operator: RSS {mib(proc_status_kib(pid, 'VmRSS')):4.0f} MiB,"
                    f" peak {mib(proc_status_kib(pid, 'VmHWM')):4.0f} MiB, CPU {cpu_seconds(pid):5.0f} s"
                )

            try:
                await wait_for(serving, timeout, "the restarted operator's first status patch", progress)
                f.restart_seconds = time.monotonic() - started
                left = max(1.0, timeout - f.restart_seconds)
                await wait_for(replaced, left, f"the replacement of {victim}, failed while it was down")
                await self.settled(start, "the restarted operator settled")
                f.restart_resumed = True
            except TimeoutError as error:
                f.restart_seconds = f.restart_seconds or time.monotonic() - started
                print(f"    restart: {error}", flush=True)
            tally = Tally(emulator, start=start, end=len(emulator._requests))
            f.restart_writes = len(tally.writes())
            f.restart_requests = breakdown(tally.requests())
            f.operator_peak_mib_restart = mib(proc_status_kib(pid, "VmHWM"))
        print(
            f"    restart: {'resumed after' if f.restart_resumed else 'NOT resumed after'}"
            f" {f.restart_seconds:.1f} s, {victim} (failed while it was down) replaced after"
            f" {f.restart_replaced_seconds:.1f} s, peak {f.operator_peak_mib_restart:.0f} MiB,"
            f" requests {f.restart_requests}",
            flush=True,
        )
