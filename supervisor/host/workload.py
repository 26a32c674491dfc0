"""The workload process of one host: its argv and environment, spawning it, its standby, stopping it.

The environment is where a workload learns who it is (`slicekeeper/protocol.py` lists every
variable): computed by pure functions of explicit inputs, so that what a pod's or a local process's
workload sees is decided in one place and can be checked without a running supervisor.

With `spec.workload.standby`, the next generation's process is started ahead of need, while the
current one trains: it imports its libraries, connects to the SDK socket, says hello and blocks
until a restart promotes it with `go` and that generation's variables (`protocol.GO`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slicekeeper.supervisor.checkpoint_tiers import Log
from slicekeeper.supervisor.host.confinement import Confinement
from slicekeeper.supervisor.plan import JobPlan
from slicekeeper.supervisor.workload_process import WorkloadProcess

from slicekeeper import protocol
from slicekeeper.api import TrainingJob, WorkloadSpec
from slicekeeper.topology import HostId, JobLayout

Send = Callable[[asyncio.StreamWriter, dict[str, Any]], Awaitable[None]]
Spawn = Callable[[Coroutine[Any, Any, None]], object]
"""Runs a coroutine in the background (the supervisor stops, loudly, if it fails)."""

_GENERATION_VARIABLES = (protocol.ENV_GENERATION, protocol.ENV_COORDINATOR, protocol.ENV_RESTORE_STEP)
"""What a standby process is started without: they come with `go` (so do the world size and rank,
which may change)."""


def reachable(hostnames: list[str], layout: JobLayout, local: bool) -> list[str]:
    """Host names as the workload can reach them: in a pod, through the job's headless Service."""
    return hostnames if local else [f"{name}.{layout.job_name}" for name in hostnames]


def megascale_env(layout: JobLayout, identity: HostId, world: Sequence[int], local: bool) -> dict[str, str]:
    """The multislice variables of this generation's world: after a scale-down, the slices taking
    part are numbered 0..n-1 again, so the pods keep their static environment."""
    slices = sorted({layout.host(h).slice for h in world} | {identity.slice})
    env = {
        protocol.ENV_MEGASCALE_NUM_SLICES: str(len(slices)),
        protocol.ENV_MEGASCALE_SLICE_ID: str(slices.index(identity.slice)),
    }
    if not local:  # locally JAX is given its coordinator; the names would not resolve
        first = layout.hostname(layout.host(world[0] if world else 0))
        env[protocol.ENV_MEGASCALE_COORDINATOR_ADDRESS] = reachable([first], layout, local)[0]
    return env


def own_cores() -> list[int]:
    """The cores this process may run on (none known: an empty list)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def workload_env(
    plan: JobPlan,
    job: TrainingJob,
    layout: JobLayout,
    identity: HostId,
    *,
    host: int,
    world: Sequence[int],
    rank: int,
    generation: int,
    coordinator: str,
    restore_step: int | None,
    socket_path: Path,
    temp_dir: Path,
    checkpoint_dir: Path,
    slow: str,
    environ: Mapping[str, str],
    cores: Sequence[int],
) -> dict[str, str]:
    """The workload's whole environment: `environ` (the supervisor's own), the job's `env`, then the
    protocol's variables. `slow`: the chaos `slow` spec (protocol.ENV_CHAOS_SLOW); `cores`: the
    machine's cores, of which a local host's own work gets one; `temp_dir`: its TMPDIR locally."""
    spec = job.spec
    env = dict(environ)
    env.update({e.name: e.value for e in spec.workload.env})
    env.update(
        {
            protocol.ENV_SOCKET: str(socket_path),
            protocol.ENV_HOST: str(host),
            protocol.ENV_NUM_HOSTS: str(len(world)),
            protocol.ENV_PROCESS_ID: str(rank),
            protocol.ENV_FULL_HOSTS: str(plan.hosts),
            protocol.ENV_CHAOS_SLOW: slow,
            protocol.ENV_GENERATION: str(generation),
            protocol.ENV_COORDINATOR: coordinator,
            protocol.ENV_RESTORE_STEP: "" if restore_step is None else str(restore_step),
            protocol.ENV_TOTAL_STEPS: str(plan.total_steps),
            protocol.ENV_RESTORE_VERIFIED: "1",  # the supervisor stages and verifies before every start
            protocol.ENV_CHECKPOINT_DIR: str(checkpoint_dir),
            protocol.ENV_CHECKPOINT_INTERVAL: str(spec.checkpoint.interval),
            protocol.ENV_CHECKPOINT_KEEP: str(spec.checkpoint.max_to_keep),
            protocol.ENV_TPU_WORKER_ID: str(identity.worker),
            protocol.ENV_TPU_WORKER_HOSTNAMES: ",".join(
                reachable(layout.slice_hostnames(identity.slice), layout, plan.local)
            ),
            protocol.ENV_TPU_NAME: f"{layout.job_name}-s{identity.slice}",
            **megascale_env(layout, identity, world, plan.local),
        }
    )
    if plan.compilation_cache:
        env[protocol.ENV_COMPILATION_CACHE] = plan.compilation_cache
    if spec.workload.init_from:
        env[protocol.ENV_INIT_FROM] = spec.workload.init_from
    if plan.local:
        # Its own temporary directory: the run's directory may be in /tmp, whose new entries a
        # confined workload cannot read (supervisor.host.confinement).
        env["TMPDIR"] = str(temp_dir)
        env[protocol.ENV_DEVICES_PER_HOST] = str(layout.devices_per_host)
        if cores:  # hosts sharing the machine: each one's own work on one core
            env[protocol.ENV_OWN_WORK_CORE] = str(cores[host % len(cores)])
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = (
            env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={layout.devices_per_host}"
        ).strip()
    return env


def standby_env(env: Mapping[str, str]) -> dict[str, str]:
    """A standby process's environment: the workload's, without the generation's variables."""
    standby = {key: value for key, value in env.items() if key not in _GENERATION_VARIABLES}
    standby[protocol.ENV_STANDBY] = "1"
    return standby


_GO_VARIABLES = (
    *_GENERATION_VARIABLES,
    protocol.ENV_NUM_HOSTS,  # the world may have changed since the standby started
    protocol.ENV_PROCESS_ID,
    protocol.ENV_MEGASCALE_NUM_SLICES,
    protocol.ENV_MEGASCALE_SLICE_ID,
    protocol.ENV_MEGASCALE_COORDINATOR_ADDRESS,
    protocol.ENV_CHAOS_SLOW,
)
"""What `go` tells a promoted standby: the variables that may differ from those it started with."""


def go_env(env: Mapping[str, str], *, local: bool) -> dict[str, str]:
    """The variables `go` gives a standby promoted to a generation, from that generation's `env`
    (locally no coordinator address: see `megascale_env`)."""
    skipped = protocol.ENV_MEGASCALE_COORDINATOR_ADDRESS if local else None
    return {key: env[key] for key in _GO_VARIABLES if key != skipped}


def workload_argv(workload: WorkloadSpec, local: bool) -> list[str]:
    """The workload's command line; locally `python` is the supervisor's own interpreter."""
    argv = [*workload.command, *workload.args]
    if local and argv[0] in ("python", "python3"):
        argv[0] = sys.executable  # the runtime's own environment has slicekeeper installed
    return argv


STANDBY_WAIT_SECONDS = 20.0
"""How long a launch waits for a standby that is still importing before starting afresh."""


@dataclass
class Standby:
    """A pre-started workload process: imports done, blocked in `connect()` until `go`."""

    process: WorkloadProcess
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    """Its standby hello arrived: it can be promoted."""
    promoted: asyncio.Event = field(default_factory=asyncio.Event)
    writer: asyncio.StreamWriter | None = None
    generation: int = -1

    def is_hello(self, message: dict[str, Any]) -> bool:
        """Whether an SDK connection's first message is this process's standby hello."""
        return bool(message.get("standby")) and message.get("pid") == self.process.pid


Env = Callable[[int, str, int | None], dict[str, str]]
"""The workload's environment for (generation, coordinator, restore step)."""


async def send_sdk_line(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    """One line to the workload's SDK (e.g. the standby's go-ahead); a workload gone is not an error."""
    writer.write(protocol.encode(message))
    with contextlib.suppress(ConnectionError):
        await writer.drain()


class Workloads:
    """This host's workload process and the standby pre-started for the next generation."""

    def __init__(
        self,
        log_path: Path,
        *,
        argv: list[str],
        env: Env,
        local: bool,
        standby: bool,
        finished: asyncio.Event,
        send: Send,
        log: Log,
        spawn: Spawn,
        confinement: Confinement | None = None,
    ) -> None:
        """`confinement`: what the workload may not read (supervisor.host.confinement).
        `env`: a generation's environment (`workload_env` with this host's place in the job);
        `local`: a local run (plan.local); `standby`: spec.workload.standby; `finished`: set when
        this supervisor ends (no standby is started after it); `send`: writes one line to the SDK
        socket."""
        self._log_path = log_path
        self.argv = argv
        self._env = env
        self._local = local
        self._standby_enabled = standby
        self._finished = finished
        self._send = send
        self._log = log
        self._spawn = spawn
        self._confinement = confinement
        self.current: WorkloadProcess | None = None
        self.standby: Standby | None = None
        self._standby_starting = False

    async def launch(self, generation: int, coordinator: str, restore_step: int | None) -> WorkloadProcess:
        """Generation `generation`'s process: the standby if it is ready (sent `go`), else a fresh
        one. A standby still importing is waited for (up to STANDBY_WAIT_SECONDS): a fresh process
        would have the same imports ahead of it. OSError: it could not be started (no current
        process then)."""
        standby = self.standby
        if standby is not None and not standby.ready.is_set() and standby.process.running:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(standby.ready.wait(), STANDBY_WAIT_SECONDS)
            standby = self.standby
        if standby is not None and standby.ready.is_set() and standby.process.running and standby.writer:
            self.standby = None
            standby.generation = generation
            go = go_env(self._env(generation, coordinator, restore_step), local=self._local)
            await self._send(standby.writer, {"type": protocol.GO, "env": go})
            self.current = standby.process
            standby.promoted.set()
            self._log({"source": "supervisor", "type": "standby_promoted", "pid": standby.process.pid})
            return standby.process
        self.drop_standby()
        try:
            env = self._env(generation, coordinator, restore_step)
            self.current = await self._start(env)
        except OSError:
            self.current = None
            raise
        return self.current

    async def _start(self, env: dict[str, str]) -> WorkloadProcess:
        """A workload process, confined when this host has a confinement."""
        if self._confinement is None:
            return await WorkloadProcess.spawn(self.argv, env, self._log_path)
        with self._confinement.ruleset() as confine:
            return await WorkloadProcess.spawn(self.argv, env, self._log_path, before_exec=confine)

    async def prestart(self, generation: int) -> None:
        """Start the next generation's process now, while this one trains (spec.workload.standby)."""
        if (
            not self._standby_enabled
            or self.standby is not None
            or self._standby_starting
            or self._finished.is_set()
        ):
            return
        self._standby_starting = True
        env = standby_env(self._env(generation, "", None))
        try:
            standby = Standby(await self._start(env))
        finally:
            self._standby_starting = False
        if self._finished.is_set():
            standby.process.kill_group()
            return
        self.standby = standby
        self._spawn(self._watch_standby(standby))

    async def _watch_standby(self, standby: Standby) -> None:
        await standby.process.wait()
        if self.standby is standby:  # died before it was needed: the next restart spawns afresh
            self.standby = None
            self._log({"source": "supervisor", "type": "standby_lost", "pid": standby.process.pid})

    def drop_standby(self) -> None:
        if self.standby is not None:
            self.standby.process.kill_group()
            self.standby = None

    def kill(self) -> None:
        """SIGKILL the standby and the workload, with their process groups, without waiting."""
        self.drop_standby()
        if self.current is not None:
            self.current.kill_group()

    async def stop(self) -> None:
        """Stop the workload's whole group, even when the main process is already gone."""
        if self.current is not None:
            await self.current.stop()
