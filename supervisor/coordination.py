"""Peer coordination: every host of a job restarts together, in a generation all of them agree on.

The leader (the supervisor of slice 0, worker 0) runs a small JSON-lines server; every supervisor
(itself included) is a member. A member reports faults, progress, committed checkpoints; the leader
turns the first fault of a generation into one restart of ALL hosts:

    RUNNING(g) --fault--> STOPPING(g): every member kills its workload and acks `stopped`
    STOPPING(g) --all acked--> RUNNING(g+1): `start` with a fresh coordinator address, the newest
                                step every host can restore, and each host's sources for its shard
    any state --budget spent--> FAILED: `fail` with the reason
    RUNNING(g) --all finished--> SUCCEEDED: `shutdown`

Faults from an older generation, or while already stopping, are ignored: no host rejoins a stale
peer, and one fault seen by every host (a hang stalls everyone) restarts the job once.

A member whose connection drops is a lost host (its machine is gone): the job stops as for a fault,
and a spare (a supervisor registered with `register_spare`) takes over the lost host's identity; it
restores that host's shard from a peer replica (supervisor.restore_plan). With no spare left the
job fails with that reason. The leader also commits persistent checkpoints once every host's shard
of a step is uploaded. Watchers (the local runtime's progress display) receive status and events.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from slicekeeper.supervisor.persistent_tier import PersistentTier, PersistentTierError
from slicekeeper.supervisor.restore_plan import Holdings, RestorePlan, Tier, plan_restore

from slicekeeper import protocol

STOP_ACK_SECONDS = 30.0
"""How long every member gets to kill its workload and ack a stop before the job fails."""

WATCHER_BUFFER_LIMIT = 1 << 20
"""Bytes of status lines a watcher may fall behind by before it is dropped."""


class JobState(StrEnum):
    REGISTERING = "registering"
    RUNNING = "running"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass
class HostStatus:
    state: str = "registering"
    step: int = 0
    loss: float | None = None
    metrics_port: int | None = None
    committed: set[int] = field(default_factory=set)
    """Steps committed in this host's local tier."""
    invalid: set[int] = field(default_factory=set)
    """Steps of this host's shard found corrupt everywhere or whose save failed: never restored."""
    replicas: dict[int, set[int]] = field(default_factory=dict)
    """owner -> steps of the owner's shard this host keeps as peer replicas (reported at stop)."""
    replica_address: str | None = None
    machine: str = ""
    steps_seen: list[tuple[float, int]] = field(default_factory=list)


@dataclass
class Spare:
    """A registered spare supervisor, idle until it takes over a lost host's identity."""

    spare: int
    writer: asyncio.StreamWriter
    machine: str
    replica_address: str | None
    metrics_port: int | None


@dataclass
class FaultRecord:
    """An injected fault and what the job made of it (times are Unix seconds)."""

    kind: str
    host: int
    step: int
    fired_at: float
    generation: int
    """The generation the fault fired in; only a detection in that generation is its detection."""
    detected_at: float | None = None
    detected_as: str | None = None
    resumed_at: float | None = None
    """First step completed after the restart it caused."""
    productive_at: float | None = None
    """First step completed beyond the job's high-water mark after that restart."""
    high_water_at_detection: int = 0
    detected_in_generation: int = -1
    spec: str = ""
    """The fault as written in --chaos, so that a spare never fires a fault its host already fired."""
    disruptive: bool = True
    """False for faults that stop nothing by themselves (corrupt): no detection is theirs."""
    detail: str = ""


@dataclass
class Detection:
    kind: str
    host: int
    generation: int
    detected_at: float
    detail: str
    restore_step: int | None = None


async def send(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    writer.write(protocol.encode(message))
    with contextlib.suppress(ConnectionError):
        await writer.drain()


class Leader:
    def __init__(
        self,
        hosts: int,
        max_restarts: int,
        coordinator_address: Callable[[int], str],
        summary_path: Path | None = None,
        max_restarts_without_progress: int = 3,
        persistent: PersistentTier | None = None,
        persistent_keep: int = 2,
    ) -> None:
        self.hosts = hosts
        self.max_restarts = max_restarts
        self.max_restarts_without_progress = max_restarts_without_progress
        self._progress_this_generation = False
        self._restarts_without_progress = 0
        self._coordinator_address = coordinator_address
        self._summary_path = summary_path
        self.state = JobState.REGISTERING
        self.generation = 0
        self.status = {h: HostStatus() for h in range(hosts)}
        self._members: dict[int, asyncio.StreamWriter] = {}
        self._spares: list[Spare] = []
        self.persistent = persistent
        self._persistent_keep = persistent_keep
        self._persisted: dict[int, set[int]] = {}
        """step -> hosts whose shard of it is uploaded to the persistent tier."""
        self.persistent_committed: set[int] = set()
        self.job_invalid: set[int] = set()
        """Steps no host may restore (a restore of them gave a non-finite loss)."""
        self.restores: list[dict[str, Any]] = []
        self.hot_swaps: list[dict[str, Any]] = []
        self.failed_saves: Counter[str] = Counter()
        self._watchers: list[asyncio.StreamWriter] = []
        self._stopped: set[int] = set()
        self._finished: dict[int, dict[str, Any]] = {}
        self.restarts: Counter[str] = Counter()
        self.faults: list[FaultRecord] = []
        self.detections: list[Detection] = []
        self.high_water = 0
        self._awaiting_resume: list[FaultRecord] = []
        self.failure_reason: str | None = None
        self._ack_deadline: asyncio.TimerHandle | None = None
        self._overdue: asyncio.Future[None] | None = None
        self.started_at = time.time()
        self._server: asyncio.Server | None = None
        self.done = asyncio.Event()

    async def serve(self, address: str, port: int) -> int:
        self._server = await asyncio.start_server(self._connection, address, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in [*self._members.values(), *self._watchers]:
            writer.close()

    # --- connections --------------------------------------------------------------------------
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    await self._handle(protocol.decode(line), writer)
                except (ValueError, KeyError, TypeError) as error:
                    # A bad message must not end the connection: that would read as a lost host.
                    print(f"leader: ignored a malformed message {line[:200]!r}: {error!r}", file=sys.stderr)
        except ConnectionError:
            pass
        finally:
            if writer in self._watchers:
                self._watchers.remove(writer)
            for spare in [s for s in self._spares if s.writer is writer]:
                self._spares.remove(spare)
                await self._event(f"spare {spare.spare} ({spare.machine}) lost while idle")
            for host, member in list(self._members.items()):
                if member is writer and self.state not in (JobState.SUCCEEDED, JobState.FAILED):
                    await self._host_lost(host)

    async def _broadcast(self, message: dict[str, Any]) -> None:
        for writer in list(self._members.values()):
            await send(writer, message)

    async def _notify(self, message: dict[str, Any]) -> None:
        """Watchers never hold the job up: no waiting on them; one that falls far behind is dropped."""
        for writer in list(self._watchers):
            if writer.transport.get_write_buffer_size() > WATCHER_BUFFER_LIMIT:
                self._watchers.remove(writer)
                writer.close()
            else:
                writer.write(protocol.encode(message))

    async def _event(self, text: str, **fields: Any) -> None:
        await self._notify({"type": "event", "t": time.time(), "text": text, **fields})

    # --- the state machine --------------------------------------------------------------------
    async def _handle(self, message: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        kind = message["type"]
        if kind == "watch":
            self._watchers.append(writer)
            await send(writer, self.status_message())
            return
        if kind == "register_spare":
            spare = Spare(
                int(message["spare"]),
                writer,
                str(message.get("machine", f"spare-{message['spare']}")),
                message.get("replica_address"),
                message.get("metrics_port"),
            )
            self._spares.append(spare)
            await self._event(f"spare {spare.spare} ({spare.machine}) registered")
            return
        host = int(message["host"])
        status = self.status[host]
        if kind == "register":
            self._members[host] = writer
            status.metrics_port = message.get("metrics_port")
            status.replica_address = message.get("replica_address")
            status.machine = str(message.get("machine", f"host-{host}"))
            status.state = "registered"
            await self._event(f"host {host} registered", host=host, metrics_port=status.metrics_port)
            if len(self._members) == self.hosts and self.state is JobState.REGISTERING:
                await self._start()
        elif kind == "state":
            status.state = message["state"]
        elif kind == "progress":
            await self._progress(host, message)
        elif kind == "checkpoint":
            status.committed.add(int(message["step"]))
        elif kind == "checkpoint_invalid":
            await self._checkpoint_invalid(host, message)
        elif kind == "persisted":
            await self._persisted_shard(host, int(message["step"]))
        elif kind == "restored":
            self._restored(host, message)
        elif kind == "chaos":
            record = FaultRecord(
                message["kind"],
                host,
                int(message["step"]),
                float(message["t"]),
                int(message.get("generation", -1)),
                spec=str(message.get("fault", "")),
                disruptive=bool(message.get("disruptive", True)),
                detail=str(message.get("detail", "")),
            )
            self.faults.append(record)
            await self._event(f"chaos: {message['kind']} host {host} at step {message['step']}", host=host)
        elif kind == "fault":
            await self._fault(host, message)
        elif kind == "stopped":
            if int(message["generation"]) == self.generation and self.state is JobState.STOPPING:
                if message.get("committed") is not None:
                    # Read from disk once the workload was dead: what the host really holds now.
                    status.committed = {int(s) for s in message["committed"]} - status.invalid
                if message.get("replicas") is not None:
                    status.replicas = {int(o): {int(s) for s in v} for o, v in message["replicas"].items()}
                self._stopped.add(host)
                status.state = "stopped"
                await self._start_when_all_stopped()
        elif (
            kind == "finished"
            and int(message["generation"]) == self.generation
            and self.state is JobState.RUNNING
        ):
            self._finished[host] = message
            status.state = "finished"
            if len(self._finished) == self.hosts:
                await self._succeed()

    async def _progress(self, host: int, message: dict[str, Any]) -> None:
        if int(message["generation"]) != self.generation or self.state is not JobState.RUNNING:
            return  # a step of a generation being torn down will be executed again
        status = self.status[host]
        step, now = int(message["step"]), float(message["t"])
        status.step, status.loss, status.state = step, message.get("loss"), "training"
        status.steps_seen.append((now, step))
        self._progress_this_generation = True
        del status.steps_seen[:-50]
        for record in list(self._awaiting_resume):
            if self.generation <= record.detected_in_generation:
                continue  # a step of the generation being torn down
            if record.resumed_at is None:
                record.resumed_at = now
            if record.productive_at is None and step > record.high_water_at_detection:
                record.productive_at = now
                self._awaiting_resume.remove(record)
        self.high_water = max(self.high_water, step)

    async def _fault(self, host: int, message: dict[str, Any]) -> None:
        generation = int(message["generation"])
        if generation != self.generation or self.state is not JobState.RUNNING:
            return  # already being handled: one restart per generation
        if message.get("invalid_step") is not None:
            # The restored state proved bad (e.g. a non-finite loss right after a restore): no host
            # may restore that step again, from any tier.
            self.job_invalid.add(int(message["invalid_step"]))
        await self._stop_job(host, message["kind"], message.get("detail", ""), float(message["t"]))

    async def _stop_job(self, host: int, kind: str, detail: str, now: float) -> bool:
        """Turn a fault of the running generation into a stop of every host; False if the job failed."""
        generation = self.generation
        # Decide before the first await: a concurrent report of the same stall must see STOPPING.
        self._restarts_without_progress = (
            0 if self._progress_this_generation else self._restarts_without_progress + 1
        )
        if self._restarts_without_progress >= self.max_restarts_without_progress:
            reason = (
                f"no progress across {self._restarts_without_progress} consecutive starts "
                f"(spec.health.maxRestartsWithoutProgress); last fault: {kind} on host {host} ({detail})"
            )
        elif sum(self.restarts.values()) >= self.max_restarts:
            reason = (
                f"restart budget spent: {self.max_restarts} in-job restarts (spec.health.maxRestarts); "
                f"last fault: {kind} on host {host} ({detail})"
            )
        else:
            reason = None
            self.restarts[kind] += 1
            self.state = JobState.STOPPING
            self._stopped.clear()
        self.detections.append(Detection(kind, host, generation, now, detail))
        for record in self.faults:
            if record.detected_at is None and record.generation == generation and record.disruptive:
                record.detected_at, record.detected_as = now, kind
                record.high_water_at_detection = self.high_water
                record.detected_in_generation = generation
                self._awaiting_resume.append(record)
        await self._event(f"{kind} detected on host {host}: {detail}", host=host, kind=kind)
        if reason is not None:
            await self._fail(reason)
            return False
        await self._broadcast({"type": "stop", "generation": self.generation, "kind": kind})
        self._ack_deadline = asyncio.get_running_loop().call_later(
            STOP_ACK_SECONDS, self._acks_overdue, self.generation
        )
        return True

    async def _host_lost(self, host: int) -> None:
        """A member's connection dropped: its machine is gone, with its local tier and replicas."""
        del self._members[host]
        lost = self.status[host]
        lost.state, lost.committed, lost.replicas = "lost", set(), {}
        self._stopped.discard(host)
        detail = f"lost contact with the supervisor of host {host} ({lost.machine or 'unknown machine'})"
        if self.state is JobState.RUNNING:
            if not await self._stop_job(host, "host_lost", detail, time.time()):
                return
        else:
            await self._event(f"host_lost detected on host {host}: {detail}", host=host, kind="host_lost")
        if not self._spares:
            await self._fail(
                f"host {host} was lost and no spare is left to take over its identity "
                "(spec.local.spares / --spares); elastic scale-down is not available yet"
            )
            return
        await self._assign_spare(host)
        if self.state is JobState.STOPPING:
            await self._start_when_all_stopped()
        elif self.state is JobState.REGISTERING and len(self._members) == self.hosts:
            await self._start()

    async def _assign_spare(self, host: int) -> None:
        spare = min(self._spares, key=lambda s: s.spare)  # deterministic: the lowest index first
        self._spares.remove(spare)
        status = HostStatus(
            state="stopped",
            metrics_port=spare.metrics_port,
            replica_address=spare.replica_address,
            machine=spare.machine,
        )
        self.status[host] = status
        self._members[host] = spare.writer
        if self.state is JobState.STOPPING:
            self._stopped.add(host)  # a newcomer has no workload to stop and holds nothing yet
        self.hot_swaps.append(
            {"host": host, "spare": spare.spare, "machine": spare.machine, "generation": self.generation}
        )
        fired = [record.spec for record in self.faults if record.host == host]
        await send(
            spare.writer, {"type": "assign", "host": host, "generation": self.generation, "fired": fired}
        )
        await self._event(
            f"hot-swap: spare {spare.spare} ({spare.machine}) takes over host {host}", host=host
        )

    async def _start_when_all_stopped(self) -> None:
        if self.state is JobState.STOPPING and len(self._stopped) == self.hosts:
            await self._start()

    async def _checkpoint_invalid(self, host: int, message: dict[str, Any]) -> None:
        step, tier = int(message["step"]), str(message.get("tier", Tier.LOCAL))
        status = self.status[host]
        reason = message.get("reason")
        if tier == Tier.LOCAL:
            status.committed.discard(step)
            if reason != "corrupt":
                status.invalid.add(step)  # a failed save: no tier will ever hold it
            # a corrupt local copy is quarantined; a peer or the persistent tier may hold a good one
        elif tier == Tier.PERSISTENT:
            self._persisted.get(step, set()).discard(host)
        elif tier == "any":
            status.invalid.add(step)  # every source of this host's shard failed at restore
        # peer: the holder simply lacks that copy, and its inventory at the next stop says so
        if message.get("reason") in ("save failed", "upload failed", "replication failed"):
            self.failed_saves[tier] += 1
        await self._event(
            f"checkpoint of step {step} on host {host} invalid ({tier}): {message.get('detail', '')}",
            host=host,
        )

    async def _persisted_shard(self, host: int, step: int) -> None:
        """Commit a persistent step once every host's shard of it is uploaded, then apply retention."""
        uploaded = self._persisted.setdefault(step, set())
        uploaded.add(host)
        if len(uploaded) < self.hosts or self.persistent is None or step in self.persistent_committed:
            return
        try:
            await asyncio.to_thread(self.persistent.commit, step)
            await asyncio.to_thread(self.persistent.retain, self._persistent_keep)
        except (OSError, PersistentTierError) as error:
            self.failed_saves[Tier.PERSISTENT] += 1
            await self._event(f"persistent checkpoint of step {step} not committed: {error}")
            return
        self.persistent_committed = set(sorted({*self.persistent_committed, step})[-self._persistent_keep :])
        for old in [s for s in self._persisted if s <= step]:
            del self._persisted[old]
        await self._event(f"persistent checkpoint of step {step} committed")

    def _restored(self, host: int, message: dict[str, Any]) -> None:
        self.restores.append(
            {
                "host": host,
                "step": int(message["step"]),
                "tier": message["tier"],
                "holder": message.get("holder"),
                "generation": self.generation,
                "seconds": message.get("seconds"),
                "bytes": message.get("bytes"),
            }
        )

    def holdings(self) -> Holdings:
        return Holdings(
            local={h: set(s.committed) for h, s in self.status.items()},
            replicas={h: {o: set(v) for o, v in s.replicas.items()} for h, s in self.status.items()},
            persistent=set(self.persistent_committed),
            invalid={h: set(s.invalid) for h, s in self.status.items()},
            job_invalid=set(self.job_invalid),
        )

    def restore_plan(self) -> RestorePlan:
        return plan_restore(range(self.hosts), self.holdings(), live=self._members.keys())

    def _acks_overdue(self, generation: int) -> None:
        if self.state is JobState.STOPPING and self.generation == generation:
            missing = sorted(set(range(self.hosts)) - self._stopped)
            reason = f"host(s) {missing} did not stop their workload within {STOP_ACK_SECONDS:.0f} s"
            self._overdue = asyncio.ensure_future(self._fail(reason))

    async def _start(self) -> None:
        if self._ack_deadline is not None:
            self._ack_deadline.cancel()
        first = self.state is JobState.REGISTERING
        plan = RestorePlan(None, {}) if first else self.restore_plan()
        if not first:
            self.generation += 1
        restore_step = plan.step

        def keep(step: int) -> bool:
            # Steps newer than the restore belong to an abandoned timeline: every tier drops them.
            return restore_step is not None and step <= restore_step

        for status in self.status.values():
            status.committed = {s for s in status.committed if keep(s)}
            status.replicas = {o: {s for s in v if keep(s)} for o, v in status.replicas.items()}
            status.invalid = {s for s in status.invalid if keep(s)}  # a re-saved step is a new one
            status.state = "starting"
        self.job_invalid = {s for s in self.job_invalid if keep(s)}
        self._persisted = {s: h for s, h in self._persisted.items() if keep(s)}
        self.persistent_committed = {s for s in self.persistent_committed if keep(s)}
        if self.detections:
            self.detections[-1].restore_step = restore_step
        self.state = JobState.RUNNING
        self._progress_this_generation = False
        self._finished.clear()
        address = self._coordinator_address(self.generation)
        addresses = {h: s.replica_address for h, s in self.status.items() if s.replica_address}
        for host, writer in list(self._members.items()):
            await send(
                writer,
                {
                    "type": "start",
                    "generation": self.generation,
                    "coordinator": address,
                    "restore_step": restore_step,
                    "sources": [src.to_message(addresses) for src in plan.sources.get(host, ())],
                    "replica_addresses": addresses,
                },
            )
        if restore_step is None and not first:
            where = "from scratch: no checkpoint step is complete across the hosts"
        else:
            where = f"from step {restore_step}" if restore_step is not None else "from scratch"
        await self._event(f"generation {self.generation} starting {where}", generation=self.generation)

    async def _succeed(self) -> None:
        self.state = JobState.SUCCEEDED
        self.write_summary()
        await self._event("training finished on every host")
        await self._broadcast({"type": "shutdown"})
        for spare in self._spares:
            await send(spare.writer, {"type": "shutdown"})
        self.done.set()

    async def _fail(self, reason: str) -> None:
        if self.state in (JobState.SUCCEEDED, JobState.FAILED):
            return
        self.state = JobState.FAILED
        self.failure_reason = reason
        self.write_summary()
        await self._event(f"job failed: {reason}")
        await self._broadcast({"type": "fail", "reason": reason})
        for spare in self._spares:
            await send(spare.writer, {"type": "shutdown"})
        self.done.set()

    # --- reporting ----------------------------------------------------------------------------
    def status_message(self) -> dict[str, Any]:
        hosts = []
        for host, status in self.status.items():
            seen = status.steps_seen
            rate = (
                (seen[-1][1] - seen[0][1]) / (seen[-1][0] - seen[0][0])
                if len(seen) > 1 and seen[-1][0] > seen[0][0]
                else None
            )
            hosts.append(
                {
                    "host": host,
                    "state": status.state,
                    "step": status.step,
                    "loss": status.loss,
                    "steps_per_second": rate,
                    "metrics_port": status.metrics_port,
                }
            )
        return {
            "type": "status",
            "t": time.time(),
            "state": self.state.value,
            "generation": self.generation,
            "restarts": dict(self.restarts),
            "hosts": hosts,
        }

    def summary(self) -> dict[str, Any]:
        fingerprints = {h: m.get("fingerprint") for h, m in self._finished.items()}
        return {
            "state": self.state.value,
            "failure_reason": self.failure_reason,
            "generations": self.generation + 1,
            "restarts": dict(self.restarts),
            "faults": [vars(f) for f in self.faults],
            "detections": [vars(d) for d in self.detections],
            "fingerprints": fingerprints,
            "steps_completed": self.high_water,
            "metrics_ports": {h: s.metrics_port for h, s in self.status.items()},
            "restores": self.restores,
            "hot_swaps": self.hot_swaps,
            "persistent_committed": sorted(self.persistent_committed),
            "failed_saves": dict(self.failed_saves),
            "machines": {h: s.machine for h, s in self.status.items()},
        }

    def write_summary(self) -> None:
        if self._summary_path is not None:
            self._summary_path.write_text(json.dumps(self.summary(), indent=1))

    async def publish_status(self, interval: float = 0.5) -> None:
        while not self.done.is_set():
            await self._notify(self.status_message())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), interval)
        await self._notify(self.status_message())
