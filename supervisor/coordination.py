"""Peer coordination: every host of a job restarts together, in a generation all of them agree on.

The leader (the supervisor of slice 0, worker 0) runs a small JSON-lines server; every supervisor
(itself included) is a member. A member reports faults, progress, committed checkpoints; the leader
turns the first fault of a generation into one restart of ALL hosts:

    RUNNING(g) --fault--> STOPPING(g): every member kills its workload and acks `stopped`
    STOPPING(g) --all acked--> RUNNING(g+1): `start` with a fresh coordinator address and the
                                newest checkpoint step every host holds
    any state --budget spent--> FAILED: `fail` with the reason
    RUNNING(g) --all finished--> SUCCEEDED: `shutdown`

Faults from an older generation, or while already stopping, are ignored: no host rejoins a stale
peer, and one fault seen by every host (a hang stalls everyone) restarts the job once.
Watchers (the local runtime's progress display) receive status and event lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

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
    invalid: set[int] = field(default_factory=set)
    """Steps found corrupt or whose save failed on this host: never chosen for a restore."""
    steps_seen: list[tuple[float, int]] = field(default_factory=list)


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
                await self._handle(protocol.decode(line), writer)
        except (ConnectionError, ValueError):
            pass
        finally:
            if writer in self._watchers:
                self._watchers.remove(writer)
            for host, member in list(self._members.items()):
                if member is writer and self.state not in (JobState.SUCCEEDED, JobState.FAILED):
                    await self._fail(f"lost contact with the supervisor of host {host}")

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
        host = int(message["host"])
        status = self.status[host]
        if kind == "register":
            self._members[host] = writer
            status.metrics_port = message.get("metrics_port")
            status.state = "registered"
            await self._event(f"host {host} registered", host=host, metrics_port=status.metrics_port)
            if len(self._members) == self.hosts and self.state is JobState.REGISTERING:
                await self._start(restore_step=None)
        elif kind == "state":
            status.state = message["state"]
        elif kind == "progress":
            await self._progress(host, message)
        elif kind == "checkpoint":
            status.committed.add(int(message["step"]))
        elif kind == "checkpoint_invalid":
            status.invalid.add(int(message["step"]))
            status.committed.discard(int(message["step"]))
        elif kind == "chaos":
            record = FaultRecord(
                message["kind"],
                host,
                int(message["step"]),
                float(message["t"]),
                int(message.get("generation", -1)),
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
                self._stopped.add(host)
                status.state = "stopped"
                if len(self._stopped) == self.hosts:
                    await self._start(restore_step=self.restore_step())
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
        kind, detail, now = message["kind"], message.get("detail", ""), float(message["t"])
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
            if record.detected_at is None and record.generation == generation:
                record.detected_at, record.detected_as = now, kind
                record.high_water_at_detection = self.high_water
                record.detected_in_generation = generation
                self._awaiting_resume.append(record)
        await self._event(f"{kind} detected on host {host}: {detail}", host=host, kind=kind)
        if reason is not None:
            await self._fail(reason)
        else:
            await self._broadcast({"type": "stop", "generation": self.generation, "kind": kind})
            self._ack_deadline = asyncio.get_running_loop().call_later(
                STOP_ACK_SECONDS, self._acks_overdue, self.generation
            )

    def _acks_overdue(self, generation: int) -> None:
        if self.state is JobState.STOPPING and self.generation == generation:
            missing = sorted(set(range(self.hosts)) - self._stopped)
            reason = f"host(s) {missing} did not stop their workload within {STOP_ACK_SECONDS:.0f} s"
            self._overdue = asyncio.ensure_future(self._fail(reason))

    def restore_step(self) -> int | None:
        """The newest step every host has committed, or None."""
        common = set.intersection(*(s.committed for s in self.status.values()))
        return max(common) if common else None

    async def _start(self, restore_step: int | None) -> None:
        if self._ack_deadline is not None:
            self._ack_deadline.cancel()
        if self.state is not JobState.REGISTERING:
            self.generation += 1
        for status in self.status.values():
            status.committed = {s for s in status.committed if restore_step is not None and s <= restore_step}
            status.state = "starting"
        if self.detections:
            self.detections[-1].restore_step = restore_step
        self.state = JobState.RUNNING
        self._progress_this_generation = False
        self._finished.clear()
        address = self._coordinator_address(self.generation)
        await self._broadcast(
            {
                "type": "start",
                "generation": self.generation,
                "coordinator": address,
                "restore_step": restore_step,
            }
        )
        where = f"from step {restore_step}" if restore_step is not None else "from scratch"
        await self._event(f"generation {self.generation} starting {where}", generation=self.generation)

    async def _succeed(self) -> None:
        self.state = JobState.SUCCEEDED
        self.write_summary()
        await self._event("training finished on every host")
        await self._broadcast({"type": "shutdown"})
        self.done.set()

    async def _fail(self, reason: str) -> None:
        if self.state in (JobState.SUCCEEDED, JobState.FAILED):
            return
        self.state = JobState.FAILED
        self.failure_reason = reason
        self.write_summary()
        await self._event(f"job failed: {reason}")
        await self._broadcast({"type": "fail", "reason": reason})
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
