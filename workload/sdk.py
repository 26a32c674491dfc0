"""Session: a training loop's connection to its supervisor.

Events are fire-and-forget lines on a Unix socket: a step costs one small `send` each side. When the
supervisor is gone (it kills us on restart anyway) or absent (standalone run, tests), events are
dropped and the loop runs as if unsupervised.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from slicekeeper.workload.own_work_core import OwnWorkCore

from slicekeeper import protocol
from slicekeeper.protocol import Event, Phase


@dataclass(frozen=True)
class HostIdentity:
    """Who this process is in the job, from the environment the supervisor set."""

    host: int
    """Which host of the job this is (its shard, its checkpoints); fixed for the job's life."""
    num_hosts: int
    """Hosts taking part in this generation: the JAX world size."""
    process_id: int
    """This host's rank among them: its JAX process id. Differs from `host` after a scale-down."""
    full_hosts: int
    """Hosts of the full job: size the global batch for these, whatever the world size."""
    hosts_per_slice: int
    """Hosts of one slice (the GKE `TPU_WORKER_HOSTNAMES` of this host's slice): the hosts a slice's
    state is split over. A generation's hosts are whole slices, ranked slice by slice."""
    generation: int
    coordinator: str | None
    restore_step: int | None
    restore_verified: bool
    """The supervisor already verified this host's shard of `restore_step` against its checksums."""
    total_steps: int
    checkpoint_dir: str | None
    checkpoint_interval: int
    checkpoint_keep: int
    compilation_cache: str | None
    init_from: str | None = None
    """`spec.workload.initFrom`: where a fresh start (no `restore_step`) takes its state and step from,
    a checkpoint in the framework's standard format (orbax_format, dcp_format)."""
    slow: tuple[float, int] | None = None
    """Chaos `slow` on this machine: (factor, first step); see protocol.ENV_CHAOS_SLOW."""
    hold: frozenset[int] = frozenset()
    """Chaos `hang` at these steps' begin: the SDK waits there for the stop (protocol.ENV_CHAOS_HOLD)."""
    own_work_core: int | None = None
    """Local mode: the core this host's own work runs on; see protocol.ENV_OWN_WORK_CORE."""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> HostIdentity:
        env = dict(os.environ) if env is None else env
        restore = env.get(protocol.ENV_RESTORE_STEP, "")
        host = int(env.get(protocol.ENV_HOST, "0"))
        num_hosts = int(env.get(protocol.ENV_NUM_HOSTS, "1"))
        slice_hosts = [name for name in env.get(protocol.ENV_TPU_WORKER_HOSTNAMES, "").split(",") if name]
        return cls(
            host=host,
            num_hosts=num_hosts,
            process_id=int(env.get(protocol.ENV_PROCESS_ID) or host),
            full_hosts=int(env.get(protocol.ENV_FULL_HOSTS) or num_hosts),
            hosts_per_slice=len(slice_hosts) or num_hosts,
            generation=int(env.get(protocol.ENV_GENERATION, "0")),
            coordinator=env.get(protocol.ENV_COORDINATOR) or None,
            restore_step=int(restore) if restore else None,
            restore_verified=env.get(protocol.ENV_RESTORE_VERIFIED) == "1",
            total_steps=int(env.get(protocol.ENV_TOTAL_STEPS, "100")),
            checkpoint_dir=env.get(protocol.ENV_CHECKPOINT_DIR) or None,
            checkpoint_interval=int(env.get(protocol.ENV_CHECKPOINT_INTERVAL, "10")),
            checkpoint_keep=int(env.get(protocol.ENV_CHECKPOINT_KEEP, "3")),
            compilation_cache=env.get(protocol.ENV_COMPILATION_CACHE) or None,
            init_from=env.get(protocol.ENV_INIT_FROM) or None,
            slow=_slow(env.get(protocol.ENV_CHAOS_SLOW, "")),
            hold=frozenset(int(step) for step in env.get(protocol.ENV_CHAOS_HOLD, "").split(",") if step),
            own_work_core=int(core) if (core := env.get(protocol.ENV_OWN_WORK_CORE)) else None,
        )


def _slow(spec: str) -> tuple[float, int] | None:
    """`F@S` (chaos `slow`, set by the supervisor) as (factor, first step); None when not slowed."""
    if not spec:
        return None
    factor, _, step = spec.partition("@")
    return float(factor), int(step or 0)


class WorkClock(Enum):
    """How a step's own work (`StepRecord.work_done`) is timed.

    The straggler score compares own work across hosts, so the clock must measure the host's work
    rather than its surroundings.
    """

    WALL = "wall"
    """Seconds on `time.monotonic`: right when the host blocks on accelerators of its own (a TPU),
    whose compute time is the wall time the host waits for it."""
    CPU = "cpu"
    """CPU seconds of this process (`time.process_time`, all threads): right when the devices are CPU
    cores shared with other hosts, as in local mode, where 4 hosts on 2 cores take turns and the wall
    time of a host's work measures the OS scheduler's choice of who runs first, not the host."""

    def now(self) -> float:
        return time.process_time() if self is WorkClock.CPU else time.monotonic()


def _burn_cpu(seconds: float) -> None:
    """Spend `seconds` of this process's CPU time: a slowed CPU device (chaos `slow`, CPU clock)."""
    deadline = time.process_time() + seconds
    while time.process_time() < deadline:
        pass


@dataclass
class StepRecord:
    """Filled in by the loop inside `with session.step(n)`; sent with the step-end event."""

    step: int
    loss: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    work: float | None = None
    """Seconds of this host's own work in the step on `clock`, set by `work_done()`."""
    clock: WorkClock = WorkClock.WALL
    """The clock own work is timed on."""
    began: float | None = None
    """`clock.now()` when the step began (now, when not given)."""
    slow_factor: float = 1.0
    """Chaos `slow`: `work_done()` stretches the step's own work this many times."""
    core: OwnWorkCore | None = None
    """Local mode: own work runs on this core until `work_done()`."""
    on_work_done: Callable[[], None] | None = None
    """Tells the supervisor this host's own work is done (where a hang stopped:
    supervisor.signals.culprit)."""

    def __post_init__(self) -> None:
        if self.began is None:
            self.began = self.clock.now()

    def _elapsed(self) -> float:
        assert self.began is not None  # set by __post_init__
        return self.clock.now() - self.began

    def work_done(self) -> None:
        """Mark the end of this host's own computation for the step.

        Call it once the step's local work is finished (blocked on), just before the host waits
        for the others in the step's cross-host collective. The step-end event then carries
        `work`: the seconds from the step's begin to this call, on the step's `clock`. The
        supervisor's straggler score compares it across hosts: a slow host's own work grows, while
        the hosts that wait for it in the collective keep a normal own-work time (their waiting
        comes after the mark), so the slow host is singled out rather than its waiting peers. A
        step without the call carries no `work`; the latest call counts when there are several.
        """
        if self.slow_factor > 1.0:
            extra = (self.slow_factor - 1.0) * self._elapsed()
            if self.clock is WorkClock.CPU:
                _burn_cpu(extra)  # a slower CPU device needs more CPU time for the same work
            else:
                time.sleep(extra)  # a slower accelerator keeps its host waiting longer
        self.work = self._elapsed()
        if self.core is not None:
            self.core.release()  # the collective and the update run on every core
        if self.on_work_done is not None:
            self.on_work_done()


class Session:
    def __init__(self, identity: HostIdentity, sock: socket.socket | None) -> None:
        self.identity = identity
        self._sock = sock
        self._unread = b""
        self.save_at: int | None = None
        """The step a notice asked to save before the workload holds (protocol.SAVE_AT)."""
        core = identity.own_work_core
        self._core = OwnWorkCore(core) if core is not None and OwnWorkCore.supported() else None

    # --- identity ---------------------------------------------------------------------------
    @property
    def total_steps(self) -> int:
        return self.identity.total_steps

    @property
    def supervised(self) -> bool:
        return self._sock is not None

    def jax_distributed_args(self) -> dict[str, Any]:
        """Keyword arguments for `jax.distributed.initialize` for this generation.

        The world is the hosts taking part in this generation (`num_hosts`, this one's rank
        `process_id`), which after a scale-down is fewer than the job's hosts. Every process but the
        coordinator's (process 0, which starts the service) returns once the coordinator accepts
        connections: a first connection refused puts gRPC in a 1 s reconnect backoff, which made
        every host's `tpu_initialization` take 1.14 s at restarts where process 0 came up last.
        """
        if self.identity.coordinator is None:
            return {}  # on GKE JAX reads the TPU_* / MEGASCALE_* variables itself
        if self.identity.process_id != 0:
            wait_for_listener(self.identity.coordinator, COORDINATOR_WAIT_SECONDS)
        return {
            "coordinator_address": self.identity.coordinator,
            "num_processes": self.identity.num_hosts,
            "process_id": self.identity.process_id,
        }

    def torch_distributed_args(self) -> dict[str, Any]:
        """Keyword arguments for `torch.distributed.init_process_group` for this generation (add the
        backend): the TCP store at the generation's coordinator, served by rank 0, as JAX's process 0
        serves its coordinator there; the world is this generation's hosts, as for JAX. Every rank
        but 0 returns once the store listens: a client refused at first retries after a backoff of
        its own (0.6 s of a restart here; 2.2 s when rank 0 came up 2 s late)."""
        if self.identity.coordinator is None:
            raise RuntimeError(
                "no coordinator for this generation: torch.distributed needs the supervisor's "
                f"{protocol.ENV_COORDINATOR} (run the loop under `slicekeeper run` or in a TrainingJob)"
            )
        if self.identity.process_id != 0:
            wait_for_listener(self.identity.coordinator, COORDINATOR_WAIT_SECONDS)
        return {
            "init_method": f"tcp://{self.identity.coordinator}",
            "rank": self.identity.process_id,
            "world_size": self.identity.num_hosts,
        }

    # --- the supervisor's requests -----------------------------------------------------------
    def _read_requests(self) -> None:
        """Take in what the supervisor said since the last look, without waiting."""
        sock = self._sock
        if sock is None:
            return
        while select.select([sock], [], [], 0)[0]:
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                return  # the supervisor is gone: it decides our fate
            self._unread += data
            *lines, self._unread = self._unread.split(b"\n")
            for line in filter(None, lines):
                message = protocol.decode(line)
                if message.get("type") == protocol.SAVE_AT:
                    self.save_at = int(message["step"])

    def save_requested(self, step: int) -> bool:
        """Whether a notice asked for `step` to be saved (then the workload holds: `hold`)."""
        self._read_requests()
        return self.save_at == step

    def hold(self) -> None:
        """Saved on a notice: train no further step (the restart would train it again); wait here
        until the supervisor stops this process."""
        self._send(Event.PHASE, phase=Phase.HELD.value)
        sock = self._sock
        while sock is not None and sock.recv(65536):
            pass
        raise SystemExit(0)  # the supervisor went away: nothing is left to do

    # --- events -----------------------------------------------------------------------------
    def _send(self, event: Event, **fields: Any) -> None:
        if self._sock is None:
            return
        try:
            self._sock.sendall(protocol.encode({"type": event.value, "t": time.time(), **fields}))
        except OSError:
            self._sock = None  # the supervisor is gone; keep training, it will decide our fate

    @contextlib.contextmanager
    def phase(self, phase: Phase) -> Iterator[None]:
        """Report a non-step phase (initialization, restore, save, ...) for the time of the block."""
        self._send(Event.PHASE, phase=phase.value)
        try:
            yield
        finally:
            self._send(Event.PHASE, phase=Phase.IDLE.value)

    @contextlib.contextmanager
    def step(self, step: int, clock: WorkClock = WorkClock.WALL) -> Iterator[StepRecord]:
        """Bracket one training step; the loop must block on the step's result inside the block.

        Call `record.work_done()` where the host's own work ends and the wait for the other hosts
        begins (see StepRecord.work_done); `clock` times that own work (see WorkClock).
        """
        slow = self.identity.slow
        factor = slow[0] if slow is not None and step >= slow[1] else 1.0
        self._send(Event.STEP_BEGIN, step=step)
        if step in self.identity.hold:
            time.sleep(protocol.CHAOS_HOLD_SECONDS)  # the supervisor's SIGSTOP lands here, in own work
        if self._core is not None:
            self._core.confine()
        record = StepRecord(
            step,
            clock=clock,
            began=clock.now(),
            slow_factor=factor,
            core=self._core,
            on_work_done=lambda: self._send(Event.WORK_DONE, step=step),
        )
        try:
            yield record
        finally:
            if self._core is not None:
                self._core.release()  # a loop that never calls work_done(), or one that raised
        fields: dict[str, Any] = {"loss": record.loss, **record.extra}
        if record.work is not None:
            fields["work"] = record.work
        if self._core is not None:
            fields["core"] = self._core.core  # hosts sharing a core are compared with each other
        self._send(Event.STEP_END, step=step, **fields)

    def checkpoint_saved(self, step: int, tier: str = "local") -> None:
        """A checkpoint for `step` is committed (durable and complete) on this host."""
        self._send(Event.CHECKPOINT_SAVED, step=step, tier=tier)

    def checkpoint_failed(
        self, step: int, tier: str = "local", reason: str = "", during: str = "save"
    ) -> None:
        """This host's copy of `step` must never be used: its save failed (`during="save"`), or it was
        found corrupt when restoring (`during="restore"`; other tiers may still hold a good copy)."""
        self._send(Event.CHECKPOINT_FAILED, step=step, tier=tier, reason=reason, during=during)

    def checkpoint_restored(self, step: int, tier: str = "local") -> None:
        self._send(Event.CHECKPOINT_RESTORED, step=step, tier=tier)

    def programs(
        self, *, loaded: Sequence[str], compiled: Sequence[str], backend_compiled: Sequence[str] | None = None
    ) -> None:
        """This start's compiled programs are ready: the names of those `loaded` from an earlier
        start (workload/compiled_programs.py) and of those `compiled` now; `backend_compiled`: what
        the framework itself says it compiled in this process so far (JAX's compile events), if the
        loop can tell. The report shows which hosts of each restart compiled anything."""
        fields: dict[str, Any] = {"loaded": list(loaded), "compiled": list(compiled)}
        if backend_compiled is not None:
            names = list(backend_compiled)
            fields.update(backend_compiled=names[:PROGRAM_NAMES_SAID], backend_compiles=len(names))
        self._send(Event.PROGRAMS, **fields)

    def done(self, step: int, fingerprint: str | None = None) -> None:
        """Training finished on this host after `step`; `fingerprint` identifies the final parameters."""
        self._send(Event.DONE, step=step, fingerprint=fingerprint)

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None


def _await_go(sock: socket.socket) -> dict[str, str]:
    """As a standby: say so, then block until the supervisor hands over a generation."""
    sock.sendall(
        protocol.encode({"type": Event.HELLO.value, "t": time.time(), "pid": os.getpid(), "standby": True})
    )
    line = sock.makefile("rb").readline()
    if not line:
        raise SystemExit(0)  # the supervisor no longer needs this standby
    message = protocol.decode(line)
    if message["type"] != protocol.GO:
        raise RuntimeError(f"slicekeeper standby: expected 'go', got {message['type']!r}")
    return {str(k): str(v) for k, v in message["env"].items()}


def connect(env: dict[str, str] | None = None) -> Session:
    """Connect to this host's supervisor (or run standalone when none is configured).

    Call it after your imports and before any work: a standby process blocks here until its
    supervisor promotes it at a restart, with the identity of that generation.
    """
    environment = dict(os.environ) if env is None else env
    path = environment.get(protocol.ENV_SOCKET)
    sock: socket.socket | None = None
    if path:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        if environment.get(protocol.ENV_STANDBY) == "1":
            generation_env = _await_go(sock)
            environment.update(generation_env)
            if env is None:
                os.environ.update(generation_env)  # e.g. for jax.distributed's own discovery
    identity = HostIdentity.from_env(environment)
    session = Session(identity, sock)
    session._send(Event.HELLO, pid=os.getpid(), generation=identity.generation)
    return session


PROGRAM_NAMES_SAID = 64
"""Of the programs the framework compiled, the names said (all are counted)."""

COORDINATOR_WAIT_SECONDS = 30.0
"""How long a process waits for its generation's coordinator to listen before leaving the rest to
the framework's own connection timeout."""


def wait_for_listener(address: str, timeout: float, interval: float = 0.005) -> bool:
    """Poll until something accepts TCP connections at `host:port`; False after `timeout`."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)
