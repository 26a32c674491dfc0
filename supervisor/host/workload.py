"""The workload process of one host: its argv and environment, spawning it, its standby, stopping it.

The environment is where a workload learns who it is (`slicekeeper/protocol.py` lists every
variable): computed by pure functions of explicit inputs, so that what a pod's or a local process's
workload sees is decided in one place and can be checked without a running supervisor. A start's
environment is a function of three values the served host holds (supervisor.host.served_host): its
context (the plan, the site, the host's identity), the leader's start, and what it takes from the
machine (`WorkloadMachine`); the host hands it down to `Workloads`, which never asks back up. What
differs between a pod and a local process is asked of the site (`WorkloadSite`, answered by
supervisor.host.site).

With `spec.workload.standby`, the next generation's process is started ahead of need, while the
current one trains: it imports its libraries, connects to the SDK socket, says hello and blocks
until a restart promotes it with `go` and that generation's variables (`protocol.GO`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.host.confinement import Confinement
from slicekeeper.supervisor.plan import JobPlan
from slicekeeper.supervisor.reporting import Log
from slicekeeper.supervisor.workload_process import WorkloadProcess

from slicekeeper import protocol
from slicekeeper.api import WorkloadSpec
from slicekeeper.shape import HostId, JobLayout, host_ranges

Send = Callable[[asyncio.StreamWriter, dict[str, Any]], Awaitable[None]]
Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]
"""Runs a coroutine in the background (the supervisor stops, loudly, if it fails)."""

_GENERATION_VARIABLES = (protocol.ENV_GENERATION, protocol.ENV_COORDINATOR, protocol.ENV_RESTORE_STEP)
"""What a standby process is started without: they come with `go` (so do the world size and rank,
which may change)."""


class WorkloadSite(Protocol):
    """What a workload's command and environment take from where it runs (supervisor.host.site)."""

    go_variables: tuple[str, ...]
    """What `go` tells a promoted standby: GO_VARIABLES, or those of them the site sets."""

    def reachable(self, layout: JobLayout, hostnames: list[str]) -> list[str]:
        """Host names as the workload reaches them."""
        ...

    def megascale_coordinator(self, layout: JobLayout, first: HostId) -> str | None:
        """The multislice coordinator's address when `first` is the world's first host (None: none)."""
        ...

    def machine_env(
        self, layout: JobLayout, host: int, *, temp_dir: Path, cores: Sequence[int], env: Mapping[str, str]
    ) -> dict[str, str]:
        """The variables of the machine the workload runs on, over `env` (its environment so far)."""
        ...

    def command(self, argv: list[str]) -> list[str]:
        """The command line `argv` as run there."""
        ...


class WorkloadContext(Protocol):
    """What a host's workload takes from the host it serves: its frozen context
    (supervisor.host.context.HostContext). Named here as a protocol, not imported: that context
    names the site, which asks this module what a workload needs."""

    @property
    def plan(self) -> JobPlan: ...
    @property
    def identity(self) -> HostId: ...
    @property
    def site(self) -> WorkloadSite: ...
    @property
    def folder(self) -> Path:
        """The machine's folder: the workload's log."""
        ...

    @property
    def finished(self) -> asyncio.Event:
        """Set when the supervisor ends: no standby is started then."""
        ...

    @property
    def log(self) -> Log: ...
    @property
    def spawn(self) -> Spawn: ...


def megascale_env(
    layout: JobLayout, identity: HostId, world: Sequence[int], site: WorkloadSite
) -> dict[str, str]:
    """The multislice variables of this generation's world: after a scale-down, the slices taking
    part are numbered 0..n-1 again, so the pods keep their static environment."""
    slices = sorted({layout.host(h).slice for h in world} | {identity.slice})
    env = {
        protocol.ENV_MEGASCALE_NUM_SLICES: str(len(slices)),
        protocol.ENV_MEGASCALE_SLICE_ID: str(slices.index(identity.slice)),
    }
    coordinator = site.megascale_coordinator(layout, layout.host(world[0] if world else 0))
    if coordinator is not None:
        env[protocol.ENV_MEGASCALE_COORDINATOR_ADDRESS] = coordinator
    return env


def own_cores() -> list[int]:
    """The cores this process may run on (none known: an empty list)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


@dataclass(frozen=True, kw_only=True)
class WorkloadMachine:
    """What a host's workload takes from the machine serving the host, as its supervisor has it when
    the workload starts."""

    socket: Path
    """The SDK socket (supervisor.host.sdk_socket)."""
    temp_dir: Path
    """The workload's own temporary directory, where hosts share the machine."""
    checkpoint_dir: Path
    """The local tier's folder, on the machine's disk (supervisor.checkpoints.tiers)."""
    cores: Sequence[int]
    """The machine's cores, of which a host sharing the machine gets one for its own work."""
    environ: Mapping[str, str]
    """The supervisor's own environment."""
    slow: str
    """The chaos `slow` spec (protocol.ENV_CHAOS_SLOW): a property of the machine (host.chaos)."""
    hold: str = ""
    """The steps a chaos `hang` stops the workload at as they begin (protocol.ENV_CHAOS_HOLD)."""


def workload_env(context: WorkloadContext, start: messages.Start, machine: WorkloadMachine) -> dict[str, str]:
    """The workload's whole environment for `start` (its generation, coordinator, restore step, world
    and rank): the supervisor's own (`machine.environ`), the job's `env`, then the protocol's
    variables, then the machine's (`context.site`: where it runs)."""
    plan, identity, site, layout = context.plan, context.identity, context.site, context.plan.layout
    spec = plan.training_job.spec
    world = start.hosts
    env = dict(machine.environ)
    env.update({e.name: e.value for e in spec.workload.env})
    env.update(
        {
            protocol.ENV_SOCKET: str(machine.socket),
            protocol.ENV_HOST: str(identity.index),
            protocol.ENV_NUM_HOSTS: str(len(world)),
            protocol.ENV_PROCESS_ID: str(start.rank),
            protocol.ENV_FULL_HOSTS: str(plan.shape.host_count),
            protocol.ENV_CHAOS_SLOW: machine.slow,
            protocol.ENV_CHAOS_HOLD: machine.hold,
            protocol.ENV_GENERATION: str(start.generation),
            protocol.ENV_COORDINATOR: start.coordinator,
            protocol.ENV_RESTORE_STEP: "" if start.restore_step is None else str(start.restore_step),
            protocol.ENV_TOTAL_STEPS: str(plan.total_steps),
            protocol.ENV_RESTORE_VERIFIED: "1",  # the supervisor stages and verifies before every start
            protocol.ENV_CHECKPOINT_DIR: str(machine.checkpoint_dir),
            protocol.ENV_CHECKPOINT_INTERVAL: str(spec.checkpoint.interval),
            protocol.ENV_CHECKPOINT_KEEP: str(spec.checkpoint.max_to_keep),
            protocol.ENV_TPU_WORKER_ID: str(identity.worker),
            protocol.ENV_TPU_WORKER_HOSTNAMES: ",".join(
                site.reachable(layout, layout.slice_hostnames(identity.slice))
            ),
            protocol.ENV_TPU_NAME: f"{layout.job_name}-s{identity.slice}",
            **megascale_env(layout, identity, world, site),
        }
    )
    if plan.compilation_cache:
        env[protocol.ENV_COMPILATION_CACHE] = plan.compilation_cache
    if spec.workload.init_from:
        env[protocol.ENV_INIT_FROM] = spec.workload.init_from
    env.update(
        site.machine_env(layout, identity.index, temp_dir=machine.temp_dir, cores=machine.cores, env=env)
    )
    return env


def presumed_start(host_count: int, host: int) -> messages.Start:
    """The start a standby is made for before the leader's first: the whole job, `host` at its own
    rank (the generation's own variables, and the world if it differs, come with `go`)."""
    return messages.Start(
        generation=0, coordinator="", restore_step=None, world=host_ranges(range(host_count)), rank=host
    )


def standby_env(env: Mapping[str, str]) -> dict[str, str]:
    """A standby process's environment: the workload's, without the generation's variables."""
    standby = {key: value for key, value in env.items() if key not in _GENERATION_VARIABLES}
    standby[protocol.ENV_STANDBY] = "1"
    return standby


GO_VARIABLES = (
    *_GENERATION_VARIABLES,
    protocol.ENV_NUM_HOSTS,  # the world may have changed since the standby started
    protocol.ENV_PROCESS_ID,
    protocol.ENV_MEGASCALE_NUM_SLICES,
    protocol.ENV_MEGASCALE_SLICE_ID,
    protocol.ENV_MEGASCALE_COORDINATOR_ADDRESS,
    protocol.ENV_CHAOS_SLOW,
    protocol.ENV_CHAOS_HOLD,
)
"""What `go` tells a promoted standby: the variables that may differ from those it started with."""


def go_env(env: Mapping[str, str], site: WorkloadSite) -> dict[str, str]:
    """The variables `go` gives a standby promoted to a generation, from that generation's `env`
    (those of `site.go_variables`)."""
    return {key: env[key] for key in site.go_variables}


def workload_argv(workload: WorkloadSpec, site: WorkloadSite) -> list[str]:
    """The workload's command line as `site` runs it."""
    return site.command([*workload.command, *workload.args])


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


async def send_sdk_line(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    """One line to the workload's SDK (e.g. the standby's go-ahead); a workload gone is not an error."""
    writer.write(protocol.encode(message))
    with contextlib.suppress(ConnectionError):
        await writer.drain()


class Workloads:
    """This host's workload process and the standby pre-started for the next generation."""

    def __init__(
        self, context: WorkloadContext, *, send: Send = send_sdk_line, confinement: Confinement | None = None
    ) -> None:
        """`send`: writes one line to the SDK socket; `confinement`: what the workload may not read
        (supervisor.host.confinement). No standby is started once the supervisor is finishing."""
        workload = context.plan.training_job.spec.workload
        self._log_path = context.folder / "workload.log"
        self.argv = workload_argv(workload, context.site)
        self._site: WorkloadSite = context.site
        self._standby_enabled = workload.standby
        self._finished = context.finished
        self._send = send
        self._log = context.log
        self._spawn = context.spawn
        self._confinement = confinement
        self.current: WorkloadProcess | None = None
        self.standby: Standby | None = None
        self._standby_starting = False

    async def launch(self, generation: int, env: dict[str, str]) -> WorkloadProcess:
        """Generation `generation`'s process, with `env` (`workload_env` of its start): the standby if
        it is ready (sent `go`), else a fresh one. A standby still importing is waited for (up to
        STANDBY_WAIT_SECONDS): a fresh process would have the same imports ahead of it. OSError: it
        could not be started (no current process then)."""
        standby = self.standby
        if standby is not None and not standby.ready.is_set() and standby.process.running:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(standby.ready.wait(), STANDBY_WAIT_SECONDS)
            standby = self.standby
        if standby is not None and standby.ready.is_set() and standby.process.running and standby.writer:
            self.standby = None
            standby.generation = generation
            go = go_env(env, self._site)
            await self._send(standby.writer, {"type": protocol.GO, "env": go})
            self.current = standby.process
            standby.promoted.set()
            self._log({"source": "supervisor", "type": "standby_promoted", "pid": standby.process.pid})
            return standby.process
        self.drop_standby()
        try:
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

    async def prestart(self, env: dict[str, str]) -> None:
        """Start the next generation's process now, while this one trains (spec.workload.standby);
        `env`: the workload's for the start it is made for (`workload_env`), less the generation's
        own variables, which come with `go`."""
        if (
            not self._standby_enabled
            or self.standby is not None
            or self._standby_starting
            or self._finished.is_set()
        ):
            return
        self._standby_starting = True
        try:
            standby = Standby(await self._start(standby_env(env)))
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
