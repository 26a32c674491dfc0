"""The supervisor of one TPU host: runs the workload, watches it, follows the job's leader.

Per host, one asyncio loop does everything: it listens to the workload's SDK events on a Unix
socket, watches the process (exits) and the clock (hangs), accounts goodput, injects the chaos
faults aimed at this host, serves Prometheus metrics, and obeys the leader's start/stop/shutdown.
The supervisor of slice 0 worker 0 also runs the leader (supervisor.coordination).

A supervisor runs on a machine (`host-i`, or `spare-j` for a spare). A spare registers with the
leader and waits; when a host is lost, the leader assigns it that host's identity and it joins the
next generation as that host, staging the host's shard from a peer (supervisor.checkpoint_tiers).
When the job scales down, the hosts of a dropped slice are `park`ed (idle, accounted as
`scaled_down`) until a scale-up starts them again; a machine being replaced while alive (a
straggler) is told to `retire` and ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slicekeeper.supervisor.checkpoint_tiers import CheckpointTiers
from slicekeeper.supervisor.coordination import Leader, send
from slicekeeper.supervisor.culprit import ActivityTracker
from slicekeeper.supervisor.hang import HangDetector
from slicekeeper.supervisor.leader_connection import reach_leader
from slicekeeper.supervisor.metrics import SupervisorMetrics
from slicekeeper.supervisor.own_pod import OwnPod
from slicekeeper.supervisor.persistent_tier import PersistentTier
from slicekeeper.supervisor.plan import JobPlan, free_port
from slicekeeper.supervisor.workload_process import WorkloadProcess

from slicekeeper import protocol
from slicekeeper.chaos import Fault, FaultKind, parse_chaos
from slicekeeper.goodput import PHASE_CATEGORY, Category, GoodputAccountant
from slicekeeper.policy.engine import PolicyEngine
from slicekeeper.protocol import Event, Phase

SDK_DRAIN_SECONDS = 1.0
"""After an exit, how long to wait for the workload's remaining SDK lines (EOF comes at once)."""

WATCH_INTERVAL = 0.05
"""Seconds between hang checks; bounds the detection latency added on top of the timeout."""

SANITY_STEPS = 3
"""Steps after a restore whose loss must be finite, or the restored step is declared bad."""

LOST_EXIT_CODE = 137
"""How a supervisor whose machine a `lose` fault took ends (as if SIGKILLed)."""

RETIRED_EXIT_CODE = protocol.EXIT_RETIRED
"""In a pod: retired by the leader, replace this pod (its phase becomes Failed even if the annotation
asking for a replacement could not be written)."""

POD_STATUS_SECONDS = 5.0
"""In a pod: how often the leader's supervisor publishes the job's progress on its own pod."""


@dataclass
class Standby:
    """A pre-started workload process: imports done, blocked in `connect()` until `go`."""

    process: WorkloadProcess
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    """Its standby hello arrived: it can be promoted."""
    promoted: asyncio.Event = field(default_factory=asyncio.Event)
    writer: asyncio.StreamWriter | None = None
    generation: int = -1


class HostSupervisor:
    def __init__(self, plan: JobPlan, machine: str, host: int | None, joined_by: str | None = None) -> None:
        """`host` None: a spare, which takes a host's identity when the leader assigns one
        (`joined_by`: the chaos fault that brought it in, for the report)."""
        self.plan = plan
        self.joined_by = joined_by
        self.machine = machine
        self.host = host if host is not None else -1
        self.job = plan.training_job
        self.layout = plan.layout
        self.identity = self.layout.host(max(self.host, 0))
        self.accountant = GoodputAccountant(time.time())
        self.detector = HangDetector(self.job.spec.health)
        self.activity = ActivityTracker()
        """Where the workload is, for the leader naming a hang's culprit (supervisor.culprit)."""
        self.journal: dict[str, Any] | None = None
        """The newest journal the leader sent (`{"type": "journal", "seq", "journal"}`)."""
        self.metrics = SupervisorMetrics(lambda: self.accountant)
        self.faults: list[Fault] = self._faults_of(host, fired=set())
        persistent = self.job.spec.checkpoint.persistent
        self.tiers = CheckpointTiers(
            plan.machine_disk(machine),
            self.job.spec.checkpoint,
            hosts=plan.hosts,
            hosts_per_slice=plan.hosts_per_slice,
            persistent=PersistentTier(persistent.uri, plan.run_key) if persistent else None,
            metrics=self.metrics,
            report=self._report,
            log=self._log,
        )
        self.tiers.host = host
        if self.tiers.persistent is not None:
            self.metrics.count_store_reads(self.tiers.persistent.reads)
        self._sanity_left = 0
        self._restored_step: int | None = None
        self.generation = -1
        self.workload: WorkloadProcess | None = None
        self._standby: Standby | None = None
        self._standby_starting = False
        self._stopping = False
        self._done_message: dict[str, Any] | None = None
        self._hang_reported = False
        self._first_step_pending = True
        self._leader_writer: asyncio.StreamWriter | None = None
        self._leader: Leader | None = None
        self._exit_code: int | None = None
        self._finished = asyncio.Event()
        self._fingerprint: str | None = None
        self._last_checkpoint: int | None = None
        self._restarts: dict[str, int] = {}
        self._faults: dict[str, int] = {}
        """Faults the leader attributed to this host, by kind (`slicekeeper_host_faults_total`)."""
        self._world: list[int] = list(range(plan.hosts))
        self._rank = max(self.host, 0)
        self._slow: float | None = None
        """Chaos `slow`: this machine's work factor (a machine property: a spare taking over is not slow)."""
        self._retired = False
        self._dir = plan.machine_dir(machine)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._socket_path = self._dir / "sdk.sock"
        self._tasks: set[asyncio.Task[None]] = set()
        self._sdk_eof: dict[int, asyncio.Event] = {}
        """Per generation: set when that workload's SDK connection has been read to the end."""
        self._events = (self._dir / "events.jsonl").open("a", buffering=1)
        self._own_pod = None if plan.local else OwnPod.from_env(os.environ)

    def _spawn_task(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run in the background, holding a reference until done (the loop keeps only weak ones)."""
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        """A supervisor that lost one of its duties must not go on half-blind: stop, loudly."""
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        traceback.print_exception(error, file=sys.stderr)
        self._terminate(f"internal error: {error!r}", exit_code=1)

    def _faults_of(self, host: int | None, fired: set[str]) -> list[Fault]:
        """The chaos faults aimed at `host` (not the job-wide ones, e.g. `spare`) not fired yet."""
        return [
            f
            for f in parse_chaos(",".join(self.plan.chaos))
            if f.targets_host and f.host == host and str(f) not in fired
        ]

    def _log(self, record: dict[str, Any]) -> None:
        """Append to this host's event log (what happened, when): for post-mortems and replay."""
        self._events.write(json.dumps({"t": time.time(), **record}) + "\n")

    # --- entry --------------------------------------------------------------------------------
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._terminate, f"received {signum.name}")
        port = self.plan.metrics_port
        if port and self.plan.local:
            # Local machines share one address: host i on port + i, spare j after the hosts, on
            # port + hosts + j (a spare keeps its port when it takes over a host); pods each have theirs.
            port += self.host if self.host >= 0 else self.plan.hosts + self._spare_index()
        leader_host, leader_port = self.plan.leader.rsplit(":", 1)
        bind = self._bind_address(leader_host)
        metrics_port = self.metrics.serve(port, bind)
        with contextlib.suppress(FileNotFoundError):
            self._socket_path.unlink()
        sdk_server = await asyncio.start_unix_server(self._sdk_connection, path=str(self._socket_path))
        replica_address = await self.tiers.serve(bind, advertise=self._advertised(bind))
        if self.host == 0:
            self._leader = Leader(
                self.plan.hosts,
                self.job.spec.health.max_restarts,
                self._coordinator_address,
                Path(self.plan.run_dir) / "job-summary.json",
                self.job.spec.health.max_restarts_without_progress,
                persistent=self.tiers.persistent,
                persistent_keep=self.job.spec.checkpoint.persistent.max_to_keep
                if self.job.spec.checkpoint.persistent
                else 2,
                hosts_per_slice=self.plan.hosts_per_slice,
                min_slices=self.job.spec.min_slices,
                devices_per_host=self.plan.devices_per_host,
                engine=PolicyEngine.from_spec(self.job.spec.policy),
                events_path=Path(self.plan.run_dir) / "policy-events.jsonl",
                replacement_timeout=self.plan.replacement_timeout,
                log_events=not self.plan.local,
            )
            await self._leader.serve(bind, int(leader_port))
            publisher = self._spawn_task(self._leader.publish_status())
            if self._own_pod is not None:
                pod_status = self._spawn_task(self._publish_pod_status())
        reader, self._leader_writer = await self._connect_leader(leader_host, int(leader_port))
        hello = {"metrics_port": metrics_port, "pid": os.getpid(), "machine": self.machine}
        hello["replica_address"] = replica_address
        watchdog = self._spawn_task(self._watch_hangs())
        try:
            if self.host >= 0:
                await send(self._leader_writer, {"type": "register", "host": self.host, **hello})
                await self._follow_leader(reader)
            else:
                spare = self._spare_index()
                joined = {"chaos": self.joined_by} if self.joined_by else {}
                await send(self._leader_writer, {"type": "register_spare", "spare": spare, **hello, **joined})
                if await self._await_assignment(reader):
                    await self._follow_leader(reader)
        finally:
            watchdog.cancel()
            self._drop_standby()
            if self.workload is not None:
                await self.workload.stop()
            sdk_server.close()
            await self.tiers.close()
            self._write_report()
            if self._leader is not None:
                await asyncio.sleep(0.2)  # let the last broadcast reach the members and watchers
                publisher.cancel()
                if self._own_pod is not None:
                    pod_status.cancel()
                    await self._annotate_own_pod(self._own_pod.publish_status, self._pod_status())
                await self._leader.close()
        return self._exit_code if self._exit_code is not None else 1

    def _spare_index(self) -> int:
        """j, of a spare machine `spare-j`."""
        return int(self.machine.rsplit("-", 1)[-1])

    def _coordinator_address(self, generation: int, rank0: int) -> str:
        if self.plan.local:
            return f"127.0.0.1:{free_port()}"
        # JAX's coordinator runs in rank 0's workload; peers reach it through the headless Service.
        return f"{self.layout.hostname(self.layout.host(rank0))}.{self.layout.job_name}:8476"

    def _bind_address(self, leader_host: str) -> str:
        """Where this supervisor's servers listen: locally the leader's loopback host; in a pod its IP
        (every pod has its own), or all interfaces when the pod's IP is not given."""
        if self.plan.local:
            return leader_host
        return self.plan.address or "0.0.0.0"

    def _advertised(self, bind: str) -> str:
        """The host peers reach this supervisor's servers at."""
        if bind != "0.0.0.0":
            return bind
        return f"{self.layout.hostname(self.identity)}.{self.layout.job_name}"

    # --- in a pod: the API server hears from the supervisor through its own pod only -------------
    async def _annotate_own_pod(self, write: Any, *args: Any) -> bool:
        error = await asyncio.to_thread(write, *args)
        if error is not None:
            print(f"[{self.machine}] {error}", file=sys.stderr, flush=True)
        return error is None

    def _pod_status(self) -> dict[str, Any]:
        assert self._leader is not None
        return {**self._leader.cluster_status(), "goodput": round(self.accountant.goodput(time.time()), 4)}

    async def _publish_pod_status(self) -> None:
        """The leader's view of the job on its own pod, for the operator's TrainingJob status."""
        assert self._own_pod is not None
        published: dict[str, Any] = {}
        while True:
            status = self._pod_status()
            changed = {**status, "goodput": None} != {**published, "goodput": None}
            if changed and await self._annotate_own_pod(self._own_pod.publish_status, status):
                published = status
            await asyncio.sleep(POD_STATUS_SECONDS)

    async def _connect_leader(
        self, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        # In a pod: waits out a slow DNS name or a late leader, then exits 4 for a new pod
        # (supervisor/leader_connection.py).
        return await reach_leader(
            host,
            port,
            in_pod=not self.plan.local,
            replacement_timeout=self.plan.replacement_timeout,
            machine=self.machine,
        )

    def _terminate(self, reason: str, exit_code: int = 130) -> None:
        self._exit_code = exit_code
        self.accountant.interrupt(time.time())
        self._drop_standby()
        if self.workload is not None:
            self.workload.kill_group()
        print(f"[host {self.host}] stopping: {reason}", file=sys.stderr, flush=True)
        if self._leader is not None:  # before its own member's connection drops
            self._leader.stand_down(reason)
        if self._leader_writer is not None:
            self._leader_writer.close()
        self._finished.set()

    async def _report(self, message: dict[str, Any]) -> None:
        if self._leader_writer is not None:
            await send(self._leader_writer, {"host": self.host, "t": time.time(), **message})

    # --- the leader's commands ----------------------------------------------------------------
    async def _await_assignment(self, reader: asyncio.StreamReader) -> bool:
        """As a spare: wait until the leader hands over a lost host's identity (False: not needed)."""
        while line := await reader.readline():
            message = protocol.decode(line)
            if message["type"] == "assign":
                self._adopt(int(message["host"]), set(message.get("fired", [])))
                return True
            if message["type"] in ("shutdown", "fail"):
                self._exit_code = 0  # the job ended without needing this spare
                return False
        self._exit_code = 0 if self._finished.is_set() else 1
        return False

    def _adopt(self, host: int, fired: set[str]) -> None:
        """Become `host`: its identity, its chaos faults not yet fired, a fresh account of time."""
        self.host = host
        self.identity = self.layout.host(host)
        self.tiers.host = host
        self.faults = self._faults_of(host, fired)
        self.accountant = GoodputAccountant(time.time())
        self.accountant.switch(Category.INFRASTRUCTURE_RECOVERY, time.time())
        self._log({"source": "leader", "type": "assign", "host": host, "machine": self.machine})
        print(f"[{self.machine}] taking over host {host}", file=sys.stderr, flush=True)

    async def _follow_leader(self, reader: asyncio.StreamReader) -> None:
        lines = asyncio.create_task(self._leader_lines(reader))
        finished = asyncio.create_task(self._finished.wait())
        await asyncio.wait({lines, finished}, return_when=asyncio.FIRST_COMPLETED)
        finished.cancel()
        if lines.done() and not lines.cancelled() and lines.exception() is not None:
            error = lines.exception()
            traceback.print_exception(error, file=sys.stderr)
            self._exit_code = 1
        lines.cancel()

    async def _leader_lines(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await reader.readline()
            except ConnectionError:
                line = b""
            if not line:
                if self._exit_code is None:
                    print(f"[host {self.host}] lost the leader; stopping", file=sys.stderr, flush=True)
                    self._exit_code = 1
                return
            message = protocol.decode(line)
            kind = message["type"]
            if kind == "start":
                addresses = {int(h): str(a) for h, a in message.get("replica_addresses", {}).items()}
                self._world = [int(h) for h in message.get("world", range(self.plan.hosts))]
                self._rank = int(message.get("rank", self._world.index(self.host)))
                self.tiers.start_generation(int(message["generation"]), addresses, self._world)
                await self._start(
                    int(message["generation"]),
                    message["coordinator"],
                    message["restore_step"],
                    message.get("sources", []),
                )
            elif kind == "stop":
                if message.get("host") == self.host:  # the fault is this host's, as the leader named it
                    self._faults[message["kind"]] = self._faults.get(message["kind"], 0) + 1
                    self.metrics.faults.labels(kind=message["kind"]).inc()
                await self._stop(int(message["generation"]), message["kind"])
            elif kind == "journal":
                self.journal = message  # the leader's newest: what a leader taking over carries on
            elif kind == "activity_request":
                snapshot = self.activity.snapshot(time.time()).to_message()
                await self._report({"type": "activity", "generation": self.generation, **snapshot})
            elif kind == "park":
                self._park(int(message["generation"]), message.get("restore_step"))
            elif kind == "retire":
                await self._retire(str(message.get("reason", "")))
                return
            elif kind == "shutdown":
                self._exit_code = 0
                return
            elif kind == "fail":
                self.accountant.interrupt(time.time())
                print(f"[host {self.host}] job failed: {message['reason']}", file=sys.stderr, flush=True)
                self._exit_code = 1
                return

    def _reachable(self, hostnames: list[str]) -> list[str]:
        """Host names as the workload can reach them: in a pod, through the job's headless Service."""
        return hostnames if self.plan.local else [f"{name}.{self.layout.job_name}" for name in hostnames]

    def _megascale_env(self) -> dict[str, str]:
        """The multislice variables of this generation's world: after a scale-down, the slices taking
        part are numbered 0..n-1 again, so the pods keep their static environment."""
        layout = self.layout
        slices = sorted({layout.host(h).slice for h in self._world} | {self.identity.slice})
        env = {
            protocol.ENV_MEGASCALE_NUM_SLICES: str(len(slices)),
            protocol.ENV_MEGASCALE_SLICE_ID: str(slices.index(self.identity.slice)),
        }
        if not self.plan.local:  # locally JAX is given its coordinator; the names would not resolve
            first = layout.hostname(layout.host(self._world[0] if self._world else 0))
            env[protocol.ENV_MEGASCALE_COORDINATOR_ADDRESS] = self._reachable([first])[0]
        return env

    def _workload_env(self, generation: int, coordinator: str, restore_step: int | None) -> dict[str, str]:
        spec = self.job.spec
        layout, ident = self.layout, self.identity
        env = dict(os.environ)
        env.update({e.name: e.value for e in spec.workload.env})
        env.update(
            {
                protocol.ENV_SOCKET: str(self._socket_path),
                protocol.ENV_HOST: str(self.host),
                protocol.ENV_NUM_HOSTS: str(len(self._world)),
                protocol.ENV_PROCESS_ID: str(self._rank),
                protocol.ENV_FULL_HOSTS: str(self.plan.hosts),
                protocol.ENV_CHAOS_SLOW: self._slow_spec(),
                protocol.ENV_GENERATION: str(generation),
                protocol.ENV_COORDINATOR: coordinator,
                protocol.ENV_RESTORE_STEP: "" if restore_step is None else str(restore_step),
                protocol.ENV_TOTAL_STEPS: str(self.plan.total_steps),
                protocol.ENV_RESTORE_VERIFIED: "1",  # _start stages and verifies before every start
                protocol.ENV_CHECKPOINT_DIR: str(self.tiers.local_dir),
                protocol.ENV_CHECKPOINT_INTERVAL: str(spec.checkpoint.interval),
                protocol.ENV_CHECKPOINT_KEEP: str(spec.checkpoint.max_to_keep),
                protocol.ENV_TPU_WORKER_ID: str(ident.worker),
                protocol.ENV_TPU_WORKER_HOSTNAMES: ",".join(
                    self._reachable(layout.slice_hostnames(ident.slice))
                ),
                protocol.ENV_TPU_NAME: f"{layout.job_name}-s{ident.slice}",
                **self._megascale_env(),
            }
        )
        if self.plan.compilation_cache:
            env[protocol.ENV_COMPILATION_CACHE] = self.plan.compilation_cache
        if self.plan.local:
            env[protocol.ENV_DEVICES_PER_HOST] = str(layout.devices_per_host)
            cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
            if cores:  # hosts sharing the machine: each one's own work on one core
                env[protocol.ENV_OWN_WORK_CORE] = str(cores[self.host % len(cores)])
            env["JAX_PLATFORMS"] = "cpu"
            env["XLA_FLAGS"] = (
                env.get("XLA_FLAGS", "")
                + f" --xla_force_host_platform_device_count={layout.devices_per_host}"
            ).strip()
        return env

    def _argv(self) -> list[str]:
        workload = self.job.spec.workload
        argv = [*workload.command, *workload.args]
        if self.plan.local and argv[0] in ("python", "python3"):
            argv[0] = sys.executable  # the runtime's own environment has slicekeeper installed
        return argv

    async def _start(
        self, generation: int, coordinator: str, restore_step: int | None, sources: list[dict[str, Any]]
    ) -> None:
        now = time.time()
        if self._last_checkpoint is not None and (
            restore_step is None or self._last_checkpoint > restore_step
        ):
            # The steps after the restore step are dropped below, from every tier of this machine:
            # the newest committed step is now the restore step (none: from scratch). Lowered before
            # the generation moves, so no scrape of the new generation sees a dropped step.
            self._last_checkpoint = restore_step
            self.metrics.last_checkpoint_step.set(restore_step or 0)
        self.generation = generation
        self.metrics.generation.set(generation)
        self._stopping = False
        self._done_message = None
        self._hang_reported = False
        self._first_step_pending = True
        self.accountant.switch(
            Category.PROGRAM_STARTUP if generation == 0 else Category.INFRASTRUCTURE_RECOVERY, now
        )
        self.detector.restart(now)
        self.activity.restart(now, restore_step)
        self._sdk_eof[generation] = asyncio.Event()
        self._log(
            {"source": "leader", "type": "start", "generation": generation, "restore_step": restore_step}
        )
        self.tiers.discard_after(restore_step)
        self._restored_step, self._sanity_left = restore_step, 0
        if restore_step is not None:
            self.accountant.switch(Category.CHECKPOINT_RESTORE, time.time())
            staged = await self.tiers.stage(restore_step, sources)
            if staged is None:
                await self._restore_failed(generation, restore_step, sources)
                return
            self._sanity_left = SANITY_STEPS
            await self._report(
                {
                    "type": "restored",
                    "step": restore_step,
                    "tier": staged.tier.value,
                    "holder": staged.holder,
                    "seconds": round(staged.seconds, 4),
                    "bytes": staged.bytes,
                }
            )
        standby = self._standby
        if standby is not None and standby.ready.is_set() and standby.process.running and standby.writer:
            self._standby = None
            standby.generation = generation
            go_env = {
                protocol.ENV_GENERATION: str(generation),
                protocol.ENV_COORDINATOR: coordinator,
                protocol.ENV_RESTORE_STEP: "" if restore_step is None else str(restore_step),
                protocol.ENV_NUM_HOSTS: str(len(self._world)),  # the world may have changed since
                protocol.ENV_PROCESS_ID: str(self._rank),
                **self._megascale_env(),
                protocol.ENV_CHAOS_SLOW: self._slow_spec(),
            }
            await send(standby.writer, {"type": protocol.GO, "env": go_env})
            self.workload = standby.process
            standby.promoted.set()
            self._log({"source": "supervisor", "type": "standby_promoted", "pid": standby.process.pid})
        else:
            self._drop_standby()
            try:
                self.workload = await WorkloadProcess.spawn(
                    self._argv(),
                    self._workload_env(generation, coordinator, restore_step),
                    self._dir / "workload.log",
                )
            except OSError as error:
                self.workload = None
                detail = f"cannot start the workload {self._argv()[0]!r}: {error.strerror or error}"
                await self._report(
                    {"type": "fault", "generation": generation, "kind": "crash", "detail": detail}
                )
                return
        self.accountant.switch(Category.PROGRAM_STARTUP, time.time())
        await self._report({"type": "state", "state": "starting"})
        self._spawn_task(self._watch_exit(self.workload, generation))

    async def _restore_failed(self, generation: int, step: int, sources: list[dict[str, Any]]) -> None:
        tried = ", ".join(s["tier"] + (f" (host {s['holder']})" if "holder" in s else "") for s in sources)
        detail = f"no valid copy of host {self.host}'s shard of step {step} (tried: {tried or 'nothing'})"
        await self._report({"type": "checkpoint_invalid", "step": step, "tier": "any", "reason": detail})
        await self._report(
            {"type": "fault", "generation": generation, "kind": "restore_failed", "detail": detail}
        )

    async def _stop(self, generation: int, kind: str) -> None:
        if generation != self.generation:
            return
        self._stopping = True
        self.tiers.pause()
        self._log({"source": "leader", "type": "stop", "generation": generation, "kind": kind})
        if self.workload is not None:
            await self.workload.stop()  # the whole group, even when the main process is already gone
        self.accountant.interrupt(time.time())
        self._restarts[kind] = self._restarts.get(kind, 0) + 1
        self.metrics.restarts.labels(kind=kind).inc()
        await self._report({"type": "stopped", "generation": generation, **self.tiers.inventory()})

    def _park(self, generation: int, restore_step: int | None) -> None:
        """This host's slice was dropped (scale-down): idle, its steps past the restore point dropped."""
        self.generation = generation  # an older workload's late words no longer count
        self.metrics.generation.set(generation)
        self._stopping = True
        self._drop_standby()
        self.tiers.start_generation(generation, {}, [])
        self.tiers.discard_after(restore_step)
        self.accountant.switch(Category.SCALED_DOWN, time.time())
        self._log(
            {"source": "leader", "type": "park", "generation": generation, "restore_step": restore_step}
        )
        print(f"[host {self.host}] parked: slice dropped by a scale-down", file=sys.stderr, flush=True)

    async def _retire(self, reason: str) -> None:
        """The leader replaced this machine while it was alive (e.g. a straggler): end, cleanly."""
        self._drop_standby()
        if self.workload is not None:
            await self.workload.stop()
        self.accountant.interrupt(time.time())
        self._retired = True
        self._exit_code = 0
        if self._own_pod is not None:
            # The operator deletes a marked pod and creates its replacement on other capacity.
            await self._annotate_own_pod(self._own_pod.ask_replacement, reason)
            self._exit_code = RETIRED_EXIT_CODE
        self._log({"source": "leader", "type": "retire", "reason": reason})
        print(f"[{self.machine}] retired: {reason}", file=sys.stderr, flush=True)

    def _slow_spec(self) -> str:
        """Chaos `slow` for the workload (protocol.ENV_CHAOS_SLOW): `F@S` before it fired, `F@0`
        after (a machine property: every later process of this machine is slow from its start)."""
        if self._slow is not None:
            return f"{self._slow}@0"
        pending = [f for f in self.faults if f.kind is FaultKind.SLOW]
        return f"{pending[0].factor}@{pending[0].step}" if pending else ""

    async def _prestart_standby(self) -> None:
        """Start the next generation's process now, while this one trains (spec.workload.standby)."""
        if (
            not self.job.spec.workload.standby
            or self._standby is not None
            or self._standby_starting
            or self._finished.is_set()
        ):
            return
        self._standby_starting = True
        env = self._workload_env(self.generation, "", None)
        for key in (protocol.ENV_GENERATION, protocol.ENV_COORDINATOR, protocol.ENV_RESTORE_STEP):
            env.pop(key)  # they come with `go` (and the world size and rank, which may change)
        env[protocol.ENV_STANDBY] = "1"
        try:
            standby = Standby(await WorkloadProcess.spawn(self._argv(), env, self._dir / "workload.log"))
        finally:
            self._standby_starting = False
        if self._finished.is_set():
            standby.process.kill_group()
            return
        self._standby = standby
        self._spawn_task(self._watch_standby(standby))

    async def _watch_standby(self, standby: Standby) -> None:
        await standby.process.wait()
        if self._standby is standby:  # died before it was needed: the next restart spawns afresh
            self._standby = None
            self._log({"source": "supervisor", "type": "standby_lost", "pid": standby.process.pid})

    def _drop_standby(self) -> None:
        if self._standby is not None:
            self._standby.process.kill_group()
            self._standby = None

    # --- watching the workload ----------------------------------------------------------------
    async def _watch_exit(self, workload: WorkloadProcess, generation: int) -> None:
        status = await workload.wait()
        # The exit can be noticed before the last SDK lines (`done`) are read: drain them first.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._sdk_eof[generation].wait(), SDK_DRAIN_SECONDS)
        if self._stopping or generation != self.generation or self._finished.is_set():
            return
        if status.succeeded and self._done_message is not None:
            self.accountant.switch(Category.CHECKPOINT_SAVE, time.time())
            await self.tiers.drain()  # the final checkpoint reaches the peer and persistent tiers
            self.accountant.switch(Category.OTHER, time.time())
            await self._report(
                {
                    "type": "finished",
                    "generation": generation,
                    "step": self._done_message["step"],
                    "fingerprint": self._done_message.get("fingerprint"),
                }
            )
            return
        detail = status.describe() if not status.succeeded else "exit code 0 before training finished"
        await self._report(
            {
                "type": "fault",
                "generation": generation,
                "kind": "crash",
                "exit_code": status.returncode if status.returncode >= 0 else None,
                "signal": status.signal_name,
                "detail": f"workload {detail} (log: {workload.log_path})",
            }
        )

    async def _watch_hangs(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            now = time.time()
            self.metrics.hang_timeout.set(self.detector.limit())
            if self.workload is None or not self.workload.running or self._stopping or self._hang_reported:
                continue
            if self.detector.hung(now):
                self._hang_reported = True
                silent = self.detector.silent_for(now)
                await self._report(
                    {
                        "type": "fault",
                        "generation": self.generation,
                        "kind": "hang",
                        "silent_seconds": round(silent, 3),
                        "detail": f"no progress for {silent:.1f} s (limit {self.detector.limit():.1f} s)",
                    }
                )

    async def _sdk_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        generation = self.generation
        try:
            line = await reader.readline()
            standby = self._standby
            if line and standby is not None and self._is_standby_hello(protocol.decode(line), standby):
                standby.writer = writer
                standby.ready.set()
                promoted = asyncio.ensure_future(standby.promoted.wait())
                exited = asyncio.ensure_future(standby.process.wait())
                await asyncio.wait({promoted, exited}, return_when=asyncio.FIRST_COMPLETED)
                promoted.cancel()
                exited.cancel()
                if not standby.promoted.is_set():
                    return  # dropped or dead before it was needed
                generation = standby.generation  # it speaks for the generation it was promoted to
                line = await reader.readline()
            while line:
                if generation != self.generation or self._stopping:
                    break  # a process of an older generation: its word no longer counts
                try:
                    await self._on_event(protocol.decode(line))
                except (ValueError, KeyError, TypeError) as error:
                    print(
                        f"[host {self.host}] ignored a malformed SDK message {line[:200]!r}: {error!r}",
                        file=sys.stderr,
                        flush=True,
                    )
                line = await reader.readline()
        except ConnectionError:
            pass
        finally:
            writer.close()
            if generation in self._sdk_eof:
                self._sdk_eof[generation].set()

    @staticmethod
    def _is_standby_hello(message: dict[str, Any], standby: Standby) -> bool:
        return bool(message.get("standby")) and message.get("pid") == standby.process.pid

    async def _on_event(self, message: dict[str, Any]) -> None:
        now = time.time()
        self._log({"source": "workload", "generation": self.generation, **message})
        event = Event(message["type"])
        if event is Event.PHASE:
            phase = Phase(message["phase"])
            self.detector.activity(now, phase)
            self.activity.phase(now, phase.value)
            self.accountant.switch(PHASE_CATEGORY[phase], now)
        elif event is Event.STEP_BEGIN:
            step = int(message["step"])
            self.detector.activity(now, Phase.IDLE)
            self.activity.step_begun(now, step)
            self.accountant.begin_step(step, now, first_of_start=self._first_step_pending)
            self._inject(step, now)
        elif event is Event.WORK_DONE:
            # Not activity for the hang timer: silence is counted from the step's begin on every host,
            # the one that stopped and the ones waiting for it alike; the leader tells them apart.
            self.activity.work_done(now, int(message["step"]))
        elif event is Event.STEP_END:
            step = int(message["step"])
            self.activity.step_ended(now, step)
            duration = self.accountant.end_step(step, now)
            self.detector.step_completed(now, duration)
            if self._first_step_pending:
                self._first_step_pending = False
                self._spawn_task(self._prestart_standby())
            if duration is not None:
                self.metrics.step_duration.observe(duration)
            if self._sanity_left > 0 and await self._restored_state_is_bad(step, message.get("loss")):
                return
            self.metrics.steps.inc()
            self.metrics.step.set(step)
            await self._report(
                {
                    "type": "progress",
                    "generation": self.generation,
                    "step": step,
                    "loss": message.get("loss"),
                    "work": message.get("work"),
                }
            )
        elif event is Event.CHECKPOINT_SAVED:
            self.detector.activity(now)
            self._last_checkpoint = int(message["step"])
            self.metrics.last_checkpoint_step.set(self._last_checkpoint)
            self.tiers.saved(self._last_checkpoint)
            await self._report({"type": "checkpoint", "step": self._last_checkpoint})
        elif event is Event.CHECKPOINT_FAILED:
            self.detector.activity(now)
            during = message.get("during", "save")
            if during == "save":
                self.metrics.checkpoint_failures.labels(tier=message.get("tier", "local")).inc()
            await self._report(
                {
                    "type": "checkpoint_invalid",
                    "step": int(message["step"]),
                    "tier": "local",
                    "reason": "save failed" if during == "save" else "corrupt",
                    "detail": message.get("reason", ""),
                }
            )
            print(
                f"[host {self.host}] checkpoint of step {message['step']} failed: {message.get('reason')}",
                file=sys.stderr,
                flush=True,
            )
        elif event is Event.CHECKPOINT_RESTORED:
            self.detector.activity(now)
            # What the workload says it loaded, next to what this supervisor staged for it.
            await self._report(
                {"type": "loaded", "generation": self.generation, "step": int(message["step"])}
            )
        elif event is Event.DONE:
            self.detector.activity(now, Phase.TEARDOWN)  # it must still exit, within the phase allowance
            self._done_message = message
            self._fingerprint = message.get("fingerprint")
        else:
            self.detector.activity(now)
        if event not in (Event.PHASE, Event.STEP_BEGIN, Event.WORK_DONE, Event.STEP_END):
            self.activity.other(now)

    async def _restored_state_is_bad(self, step: int, loss: Any) -> bool:
        """The first steps after a restore must give a finite loss, or the restored step is bad."""
        self._sanity_left -= 1
        if loss is None or math.isfinite(float(loss)):
            return False
        self._sanity_left = 0
        detail = f"loss {loss} at step {step}, right after restoring step {self._restored_step}"
        await self._report(
            {
                "type": "fault",
                "generation": self.generation,
                "kind": "nonfinite_loss",
                "detail": detail,
                "invalid_step": self._restored_step,
            }
        )
        return True

    def _inject(self, step: int, now: float) -> None:
        """Fire the chaos faults aimed at this host and this step (each exactly once)."""
        for fault in [f for f in self.faults if f.step == step]:
            self.faults.remove(fault)
            assert self.workload is not None
            chaos: dict[str, Any] = {
                "type": "chaos",
                "kind": fault.kind.value,
                "step": step,
                "fault": str(fault),
                "generation": self.generation,
                # corrupt and slow stop nothing by themselves: no restart's detection is theirs
                "disruptive": fault.kind.disruptive,
            }
            if fault.kind is FaultKind.KILL:
                self.workload.signal(signal.SIGKILL)
            elif fault.kind is FaultKind.HANG:
                self.workload.signal(signal.SIGSTOP)
            elif fault.kind is FaultKind.SLOW:
                self._slow = fault.factor  # the SDK applies it (protocol.ENV_CHAOS_SLOW)
            elif fault.kind is FaultKind.CORRUPT:
                corrupted = self.tiers.corrupt_newest()
                chaos["detail"] = (
                    f"flipped bytes in local step {corrupted}, noticed at the next restore"
                    if corrupted is not None
                    else "no committed local step to corrupt yet"
                )
            elif fault.kind is FaultKind.LOSE:
                self._spawn_task(self._lose_machine(chaos))
                continue
            self._log({"source": "chaos", **chaos})
            self._spawn_task(self._report(chaos))

    async def _lose_machine(self, chaos: dict[str, Any]) -> None:
        """Chaos `lose`: this machine is gone for good, processes and disk; the leader sees it vanish."""
        self._log({"source": "chaos", **chaos})
        await self._report(chaos)
        self._drop_standby()
        if self.workload is not None:
            self.workload.kill_group()
        self.tiers.wipe()
        self.accountant.interrupt(time.time())
        self._write_report(lost=True)  # a simulation's courtesy: the time this host trained still counts
        print(f"[{self.machine}] lost (chaos {chaos['fault']})", file=sys.stderr, flush=True)
        os._exit(LOST_EXIT_CODE)

    # --- the end ------------------------------------------------------------------------------
    def _write_report(self, lost: bool = False) -> None:
        now = time.time()
        seconds = self.accountant.seconds(now)
        report = {
            "machine": self.machine,
            "lost": lost,
            "retired": self._retired,
            "host": self.host if self.host >= 0 else None,
            "slice": self.identity.slice,
            "worker": self.identity.worker,
            "wall_seconds": now - self.accountant.start,
            "seconds": {c.value: v for c, v in seconds.items()},
            "high_water": self.accountant.high_water,
            "productive_step_seconds": self.accountant.productive_step_seconds,
            "restarts": self._restarts,
            "faults": self._faults,
            "journal_seq": self.journal["seq"] if self.journal else None,
            "fingerprint": self._fingerprint,
            "last_checkpoint_step": self._last_checkpoint,
            "typical_step_seconds": self.detector.typical_step_seconds,
            "exit_code": self._exit_code,
            "persistent_reads": asdict(self.tiers.persistent.reads) if self.tiers.persistent else None,
        }
        (self._dir / "report.json").write_text(json.dumps(report, indent=1))
        self._events.close()
