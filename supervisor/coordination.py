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

What the job does about a fault is the remediation policy's decision (supervisor.remediation, the
user's hooks or the default escalation ladder): restart in job, replace a host by a spare, scale down
by whole slices, scale back up, wait, ignore, fail. The decision is taken while the members stop; the
next generation's start applies it:

- replace: a spare (a supervisor registered with `register_spare`) takes over the host's identity and
  restores its shard from a peer replica (supervisor.restore_plan); a live machine being replaced (a
  straggler) is told to `retire` first;
- scale down: the slices dropped get `park` instead of `start`; the others start on a smaller world
  (rank and world size in `start`); scale up brings parked hosts and spares back in.

A member whose connection drops is a lost host (its machine is gone). Straggler findings (from the
per-host own-work times in `progress`) and spares registering while the job is scaled down are events
too, decided while the job runs. A hang is decided as the host that stopped (supervisor.culprit). The
leader also commits persistent checkpoints once every active host's shard of a step is uploaded.
Watchers (the local runtime's progress display) receive status and events.

What the job has been through (`self.memory`, supervisor.job_memory) is kept apart from the leader's
connections and timers, as a value a leader taking over can carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slicekeeper.supervisor.culprit import Activity, name_culprit
from slicekeeper.supervisor.job_memory import Detection, FaultRecord, JobMemory, JobState
from slicekeeper.supervisor.persistent_tier import PersistentTier, PersistentTierError
from slicekeeper.supervisor.remediation import Remediation
from slicekeeper.supervisor.restore_plan import Holdings, RestorePlan, Tier, plan_restore
from slicekeeper.supervisor.world import JobWorld

from slicekeeper import policy, protocol
from slicekeeper.policy.engine import PolicyEngine

STOP_ACK_SECONDS = 30.0
"""How long every member gets to kill its workload and ack a stop before the job fails."""

PERSISTENT_LISTING_ATTEMPTS = 3
PERSISTENT_LISTING_BACKOFF = 2.0
"""At the first start, a persistent tier that cannot be listed is tried this many times, this many
seconds apart times the attempt, before the job fails."""

ACTIVITY_REPLY_SECONDS = 2.0
"""At a hang report, how long every member gets to say where its workload is (supervisor.culprit);
one that does not answer in time is taken for the host that stopped."""

WATCHER_BUFFER_LIMIT = 1 << 20
"""Bytes of status lines a watcher may fall behind by before it is dropped."""


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


async def send(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    writer.write(protocol.encode(message))
    with contextlib.suppress(ConnectionError):
        await writer.drain()


class Leader:
    def __init__(
        self,
        hosts: int,
        max_restarts: int,
        coordinator_address: Callable[[int, int], str],
        summary_path: Path | None = None,
        max_restarts_without_progress: int = 3,
        persistent: PersistentTier | None = None,
        persistent_keep: int = 2,
        *,
        hosts_per_slice: int | None = None,
        min_slices: int = 1,
        devices_per_host: int = 1,
        engine: PolicyEngine | None = None,
        events_path: Path | None = None,
        replacement_timeout: float | None = None,
        log_events: bool = False,
    ) -> None:
        self.hosts = hosts
        self.memory = JobMemory(started_at=time.time())
        """The job's memory (supervisor.job_memory): what a leader that takes over carries on."""
        self._journal_seq = 0
        """Journals sent so far (`_replicate`): a member keeps the one with the highest number."""
        self._standing_down = False
        """The leader's process is ending (`stand_down`): it acts no more."""
        self.log_events = log_events
        """Print every event on stderr: in a pod, where no runtime watches, the leader pod's log
        (`kubectl logs <job>-s0-w0`) tells the job's story."""
        per_slice = hosts_per_slice or hosts
        self.world = JobWorld(hosts // per_slice, per_slice, min_slices, devices_per_host)
        self.remediation = Remediation(engine or PolicyEngine(None), self.world, events_path=events_path)
        self._deciding = 0
        """Decisions under way that the next start must wait for."""
        self._decision_turn = asyncio.Lock()
        self._waiting = 0
        """`Wait` decisions taken while the job is stopped: it stays stopped until they are reconsidered."""
        self._joined: set[int] = set()
        """Hosts entering the world at the next start (their slice comes back): they may use twins."""
        self._capacity_offer = False
        self.replacement_timeout = replacement_timeout
        """In a cluster: the operator replaces a lost host by a new pod with its identity, which registers
        as that host; a replacement is awaited this long. None: local mode, spares stand in."""
        self._awaited: dict[int, asyncio.TimerHandle] = {}
        """In a cluster: hosts whose replacement pod is awaited, with the end of each wait."""
        self._no_capacity = False
        """In a cluster: a replacement did not join in time; the policy sees no spare until one joins."""
        self.max_restarts = max_restarts
        self.max_restarts_without_progress = max_restarts_without_progress
        self._progress_this_generation = False
        self._coordinator_address = coordinator_address
        self._summary_path = summary_path
        self.status = {h: HostStatus() for h in range(hosts)}
        self._members: dict[int, asyncio.StreamWriter] = {}
        self._spares: list[Spare] = []
        self.persistent = persistent
        self._persistent_keep = persistent_keep
        self._tasks: set[asyncio.Future[None]] = set()
        self._first_start_under_way = False
        self._activities: dict[int, Activity] | None = None
        """While a hang's culprit is being named: the members' answers so far (else None)."""
        self._activities_in = asyncio.Event()
        self._watchers: list[asyncio.StreamWriter] = []
        self._stopped: set[int] = set()
        self._finished: dict[int, dict[str, Any]] = {}
        self._ack_deadline: asyncio.TimerHandle | None = None
        self._overdue: asyncio.Future[None] | None = None
        self._server: asyncio.Server | None = None
        self.done = asyncio.Event()

    def journal(self) -> dict[str, Any]:
        """All the job's memory as JSON: what a leader taking over needs to carry on (`carry_on`)."""
        return {
            "memory": self.memory.to_json(),
            "world": self.world.state(),
            "remediation": self.remediation.state(),
        }

    def carry_on(self, journal: dict[str, Any]) -> None:
        """Take over the memory another leader of this job wrote down (`journal`)."""
        self.memory = JobMemory.from_json(journal["memory"])
        self.world.carry_on(journal["world"])
        self.remediation.carry_on(journal["remediation"])

    async def serve(self, address: str, port: int) -> int:
        self._server = await asyncio.start_server(
            self._connection, address, port, limit=protocol.CONTROL_LINE_LIMIT
        )
        return int(self._server.sockets[0].getsockname()[1])

    def stand_down(self, reason: str) -> None:
        """This leader's process is ending (SIGTERM: the pod deleted, the job suspended): it acts no
        more. Members' connections dropping now are its own ending, not hosts lost, and no decision
        is taken on them; the job's memory stays as it was (a leader taking over carries it on)."""
        if not self._standing_down:
            self._standing_down = True
            self._spawn(self._event(f"leader standing down: {reason}"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
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
        except (ConnectionError, asyncio.CancelledError):
            pass  # cancelled: the process is ending (asyncio.run's teardown); no traceback for that
        finally:
            if writer in self._watchers:
                self._watchers.remove(writer)
            ended = self.memory.state in (JobState.SUCCEEDED, JobState.FAILED)
            for spare in [s for s in self._spares if s.writer is writer]:
                self._spares.remove(spare)
                if not ended and not self._standing_down:  # else: it shut down with the job or leader
                    await self._event(f"spare {spare.spare} ({spare.machine}) lost while idle")
            for host, member in list(self._members.items()):
                if member is writer and not ended and not self._standing_down:
                    await self._host_lost(host)

    async def _replicate(self) -> None:
        """Write the journal down on every member, before the command it leads to (write-ahead): a
        member that received a command also holds the journal that ordered it, so a leader that takes
        over from any member carries on from there, never from before a decision already acted on."""
        self._journal_seq += 1
        message = {"type": "journal", "seq": self._journal_seq, "journal": self.journal()}
        await self._broadcast(message)

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
        now = time.time()
        if self.log_events:
            stamp = time.strftime("%H:%M:%S", time.gmtime(now))
            print(f"[leader {stamp}] {text}", file=sys.stderr, flush=True)
        await self._notify({"type": "event", "t": now, "text": text, **fields})

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
            if message.get("chaos"):
                self.memory.faults.append(
                    FaultRecord(
                        "spare",
                        -1,
                        self.memory.high_water,
                        time.time(),
                        self.memory.generation,
                        spec=str(message["chaos"]),
                        disruptive=False,
                        detail=f"{spare.machine} joined",
                    )
                )
            if self.world.scaled_down:
                self._capacity_offer = True
                await self._offer_capacity()
            return
        host = int(message["host"])
        status = self.status[host]
        cluster = self.replacement_timeout is not None
        if kind == "register" and cluster and self.memory.state is not JobState.REGISTERING:
            await self._replacement_joined(host, message, writer)
        elif kind == "register":
            self._members[host] = writer
            status.metrics_port = message.get("metrics_port")
            status.replica_address = message.get("replica_address")
            status.machine = str(message.get("machine", f"host-{host}"))
            status.state = "registered"
            await self._event(f"host {host} registered", host=host, metrics_port=status.metrics_port)
            if len(self._members) == self.hosts and self.memory.state is JobState.REGISTERING:
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
        elif kind == "loaded":
            self._loaded(host, message)
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
            self.memory.faults.append(record)
            await self._event(f"chaos: {message['kind']} host {host} at step {message['step']}", host=host)
            await self._replicate()  # a fault fired never fires again, whoever leads
        elif kind == "fault":
            await self._fault(host, message)
        elif kind == "activity":
            if self._activities is not None and int(message["generation"]) == self.memory.generation:
                self._activities[host] = Activity.from_message(message)
                if set(self.world.hosts) & self._members.keys() <= self._activities.keys():
                    self._activities_in.set()
        elif kind == "stopped":
            if (
                int(message["generation"]) == self.memory.generation
                and self.memory.state is JobState.STOPPING
            ):
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
            and int(message["generation"]) == self.memory.generation
            and self.memory.state is JobState.RUNNING
        ):
            self._finished[host] = message
            status.state = "finished"
            if set(self.world.hosts) <= self._finished.keys():
                await self._succeed()

    async def _progress(self, host: int, message: dict[str, Any]) -> None:
        if int(message["generation"]) != self.memory.generation or self.memory.state is not JobState.RUNNING:
            return  # a step of a generation being torn down will be executed again
        status = self.status[host]
        step, now = int(message["step"]), float(message["t"])
        status.step, status.loss, status.state = step, message.get("loss"), "training"
        status.steps_seen.append((now, step))
        self._progress_this_generation = True
        del status.steps_seen[:-50]
        work = message.get("work")
        for finding in self.remediation.observe(
            host, step, None if work is None else float(work), {h: s.machine for h, s in self.status.items()}
        ):
            await self._event(
                f"straggler: host {finding.host} score {finding.score:.2f} at step {finding.step}",
                host=finding.host,
            )
            for record in self.memory.faults:  # a `slow` fault is detected when its host is found straggling
                if record.kind == "slow" and record.host == finding.host and record.detected_at is None:
                    record.detected_at, record.detected_as = now, "straggler"
            event = policy.Straggler(
                t=now,
                step=self.memory.high_water,
                generation=self.memory.generation,
                host=finding.host,
                score=finding.score,
            )
            self._spawn(self._decide_and_act(event))
        if self._capacity_offer:
            await self._offer_capacity()
        for record in self.memory.awaiting_resume():
            if self.memory.generation <= record.detected_in_generation:
                continue  # a step of the generation being torn down
            if record.resumed_at is None:
                record.resumed_at = now
            if record.productive_at is None and step > record.high_water_at_detection:
                record.productive_at = now
                await self._replicate()
        self.memory.high_water = max(self.memory.high_water, step)

    async def _fault(self, host: int, message: dict[str, Any]) -> None:
        generation = int(message["generation"])
        if generation != self.memory.generation or self.memory.state is not JobState.RUNNING:
            return  # already being handled: one restart per generation
        if message.get("invalid_step") is not None:
            # The restored state proved bad (e.g. a non-finite loss right after a restore): no host
            # may restore that step again, from any tier.
            self.memory.job_invalid.add(int(message["invalid_step"]))
        if message["kind"] == "hang":
            if self._activities is None:  # else: the same stall, noticed again while being named
                # Not awaited here: the answers come over the members' connections, the reporter's
                # included, whose reading must go on.
                self._activities = {}
                self._spawn(self._hang_fault(host, message))
            return
        await self._fault_of(host, message)

    async def _fault_of(self, host: int, message: dict[str, Any]) -> None:
        """Stop the job for a fault of `host`, then decide what to do about it."""
        generation = self.memory.generation
        event = Remediation.fault_event(host, message, self.memory.high_water, generation)
        if await self._stop_job(host, message["kind"], message.get("detail", ""), float(message["t"])):
            await self._decide_and_act(event)

    async def _hang_fault(self, reporter: int, message: dict[str, Any]) -> None:
        generation = self.memory.generation
        host, message = await self._hang_culprit(reporter, message)
        if (
            generation == self.memory.generation and self.memory.state is JobState.RUNNING
        ):  # else: stopped meanwhile
            await self._fault_of(host, message)

    async def _hang_culprit(self, reporter: int, message: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Ask every member where its workload is and name the host that stopped (supervisor.culprit);
        returns it with the report's detail saying who noticed and why that host."""
        self._activities, self._activities_in = {}, asyncio.Event()
        try:
            asked = [h for h in self.world.hosts if h in self._members]
            for member in asked:
                await send(
                    self._members[member], {"type": "activity_request", "generation": self.memory.generation}
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._activities_in.wait(), ACTIVITY_REPLY_SECONDS)
            answers: dict[int, Activity | None] = {h: self._activities.get(h) for h in asked}
        finally:
            self._activities = None
        culprit = name_culprit(answers, reporter)
        noticed = f"noticed by host {reporter}" if culprit.host != reporter else "noticed by itself"
        detail = f"{message.get('detail', '')} ({noticed}; {culprit.reason})"
        return culprit.host, {**message, "detail": detail}

    async def _stop_job(self, host: int, kind: str, detail: str, now: float, planned: bool = False) -> bool:
        """Turn a fault of the running generation into a stop of every host; False if the job failed.

        `planned`: a stop the policy chose with nothing broken (a scale-up): no restart budget applies."""
        generation = self.memory.generation
        # Decide before the first await: a concurrent report of the same stall must see STOPPING.
        self.memory.restarts_without_progress = (
            0 if self._progress_this_generation or planned else self.memory.restarts_without_progress + 1
        )
        cause = {
            "kind": kind,
            "host": host,
            "t": now,
            "high_water": self.memory.high_water,
            "planned": planned,
        }
        if planned:
            reason = None
            self.memory.restarts[kind] += 1
            self.memory.state = JobState.STOPPING
            self._stopped.clear()
            self.memory.stop_cause = cause
        elif self.memory.restarts_without_progress >= self.max_restarts_without_progress:
            reason = (
                f"no progress across {self.memory.restarts_without_progress} consecutive starts "
                f"(spec.health.maxRestartsWithoutProgress); last fault: {kind} on host {host} ({detail})"
            )
        elif sum(self.memory.restarts.values()) >= self.max_restarts:
            reason = (
                f"restart budget spent: {self.max_restarts} in-job restarts (spec.health.maxRestarts); "
                f"last fault: {kind} on host {host} ({detail})"
            )
        else:
            reason = None
            self.memory.restarts[kind] += 1
            self.memory.state = JobState.STOPPING
            self._stopped.clear()
            self.memory.stop_cause = cause
        for record in self.memory.faults if not planned else []:
            if record.detected_at is None and record.generation == generation and record.disruptive:
                record.detected_at, record.detected_as = now, kind
                record.high_water_at_detection = self.memory.high_water
                record.detected_in_generation = generation
        if planned:
            await self._event(f"stopping every host: {detail} ({kind})", kind=kind)
        else:
            self.memory.detections.append(Detection(kind, host, generation, now, detail))
            await self._event(f"{kind} detected on host {host}: {detail}", host=host, kind=kind)
        if reason is not None:
            await self._fail(reason)
            return False
        await self._replicate()
        for member in self.world.hosts:
            if member in self._members:
                await send(
                    self._members[member],
                    {
                        "type": "stop",
                        "generation": self.memory.generation,
                        "kind": kind,
                        "host": None if planned else host,  # whose fault it is (a planned stop: none)
                    },
                )
        self._ack_deadline = asyncio.get_running_loop().call_later(
            STOP_ACK_SECONDS, self._acks_overdue, self.memory.generation
        )
        return True

    async def _host_lost(self, host: int) -> None:
        """A member's connection dropped: its machine is gone, with its local tier and replicas."""
        del self._members[host]
        lost = self.status[host]
        lost.state, lost.committed, lost.replicas = "lost", set(), {}
        self._stopped.discard(host)
        detail = f"lost contact with the supervisor of host {host} ({lost.machine or 'unknown machine'})"
        if host not in self.world.hosts:
            # An idle host of a dropped slice: nothing stops; a scale-up will need a spare for it.
            await self._event(f"idle host {host} of a dropped slice lost: {detail}", host=host)
            return
        if self.memory.state is JobState.RUNNING:
            if not await self._stop_job(host, "host_lost", detail, time.time()):
                return
        else:
            await self._event(f"host_lost detected on host {host}: {detail}", host=host, kind="host_lost")
        if self.memory.state is JobState.REGISTERING:
            if self.replacement_timeout is not None:
                return  # in a cluster the operator re-creates the pod, which registers as any other
            # Before the first start nothing trained yet: a spare stands in, or the job cannot start.
            if not self._spares:
                await self._fail(f"host {host} was lost before the job started and no spare is left")
                return
            await self._assign_spare(host)
            if len(self._members) == self.hosts:
                await self._start()
            return
        event = policy.HostLost(
            t=time.time(),
            step=self.memory.high_water,
            generation=self.memory.generation,
            host=host,
            machine=lost.machine,
        )
        await self._decide_and_act(event)

    # --- remediation: decide, then act --------------------------------------------------------
    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _idle_hosts(self) -> set[int]:
        return {h for h in self._members if h not in self.world.hosts}

    async def _decide_and_act(self, event: policy.Event) -> None:
        self._deciding += 1  # counted while queued too: no start before every pending decision is in
        try:
            # One at a time: each decision is taken on the world the previous one left.
            async with self._decision_turn:
                if self.memory.state in (JobState.SUCCEEDED, JobState.FAILED):
                    return
                decision = await asyncio.to_thread(
                    self.remediation.decide,
                    event,
                    spares=self._spare_count(),
                    idle=self._idle_hosts(),
                    step=self.memory.high_water,
                    generation=self.memory.generation,
                )
                action = decision.action
                reason = f" ({decision.reason})" if decision.reason else ""
                await self._event(
                    f"decision ({decision.source.value}): {action.name} for {event.summary}{reason}"
                )
                await self._replicate()  # the decision, before anything is done about it
                await self._act(event, action)
        finally:
            self._deciding -= 1
        await self._start_when_all_stopped()

    async def _act(self, event: policy.Event, action: policy.Action) -> None:
        if self.memory.state in (JobState.SUCCEEDED, JobState.FAILED):
            return
        if isinstance(action, policy.Fail):
            await self._fail(action.reason)
        elif isinstance(action, policy.Wait):
            holds = self.memory.state is JobState.STOPPING  # the job stays stopped until reconsidered
            self._waiting += holds
            loop = asyncio.get_running_loop()
            loop.call_later(action.seconds, lambda: self._spawn(self._reconsider(event, holds)))
        elif isinstance(action, (policy.ReplaceHost, policy.ScaleDown, policy.ScaleUp)):
            if self.memory.state is JobState.RUNNING:
                host = getattr(event, "host", 0)
                planned = isinstance(action, policy.ScaleUp)
                if not await self._stop_job(host, str(event.kind), action.name, time.time(), planned):
                    return
            await self._apply(event, action)
        # RestartInJob: the stop under way is the restart; Ignore: nothing to do.

    async def _reconsider(self, event: policy.Event, held: bool) -> None:
        """A `Wait` is over: offer the same event again, with the facts of now."""
        self._waiting -= held
        if isinstance(event, policy.CapacityReturned) and not self.world.scaled_down:
            return
        fresh = dataclasses.replace(
            event, t=time.time(), step=self.memory.high_water, generation=self.memory.generation
        )
        await self._decide_and_act(fresh)

    async def _offer_capacity(self) -> None:
        """Spares joined while the job runs scaled down: the policy may scale back up."""
        if self.memory.state is not JobState.RUNNING or not self._progress_this_generation or self._deciding:
            return  # offered once the job trains again
        self._capacity_offer = False
        event = policy.CapacityReturned(
            t=time.time(),
            step=self.memory.high_water,
            generation=self.memory.generation,
            spares=len(self._spares),
        )
        await self._decide_and_act(event)

    async def _apply(self, event: policy.Event, action: policy.Action) -> None:
        """Change who takes part, while the job is stopped; the next start runs the new world."""
        before = list(self.world.active)
        if isinstance(action, policy.ReplaceHost) and self.replacement_timeout is not None:
            await self._await_replacement(action.host, f"replaced ({event.kind})")
        elif isinstance(action, policy.ReplaceHost):
            if not self._spares:
                await self._fail(f"no spare left to replace host {action.host}")
                return
            if action.host in self._members:
                await self._retire(action.host, f"replaced ({event.kind})")
            await self._assign_spare(action.host)
        elif isinstance(action, policy.ScaleDown):
            host = getattr(event, "host", None)
            slices = list(action.slices) or ([self.world.slice_of(host)] if host is not None else [])
            slices = [s for s in slices if s in self.world.active]
            if slices:
                try:
                    self.world.drop(slices)
                except ValueError as error:
                    await self._fail(str(error))
                    return
                self._joined -= {h for s in slices for h in self.world.hosts_of(s)}
                self.remediation.scaled(
                    "down", before, self.memory.high_water, self.memory.generation, str(event.kind)
                )
                await self._event(
                    f"scale-down: slice(s) {slices} dropped, {len(self.world.hosts)} hosts go on"
                )
        elif isinstance(action, policy.ScaleUp):
            back = self.world.restorable(self._idle_hosts(), len(self._spares))
            for slice_index in back:
                for host in self.world.hosts_of(slice_index):
                    if host not in self._members:
                        await self._assign_spare(host, scale_up=True)
                    self._stopped.add(host)  # idle or new: no workload to stop
                    self._joined.add(host)
            if back:
                self.world.restore(back)
                self.remediation.scaled(
                    "up", before, self.memory.high_water, self.memory.generation, str(event.kind)
                )
                await self._event(f"scale-up: slice(s) {back} back, {len(self.world.hosts)} hosts")

    # --- in a cluster: replacements are new pods ----------------------------------------------
    def _spare_count(self) -> int:
        """Spares the policy may count on: locally the idle spare supervisors; in a cluster the operator
        replaces any host (one at a time is enough to say so) until a replacement failed to join."""
        if self.replacement_timeout is None:
            return len(self._spares)
        return 0 if self._no_capacity else 1

    async def _await_replacement(self, host: int, reason: str) -> None:
        """ReplaceHost in a cluster: the host's pod goes (a live one retires: its supervisor marks its pod
        for replacement and ends), the operator creates a new pod with the same identity, and the job
        stays stopped until that pod's supervisor registers, or `replacement_timeout` passes."""
        assert self.replacement_timeout is not None
        if host in self._members:
            await self._retire(host, reason)
        self.status[host] = HostStatus(state="awaiting replacement")
        if host in self._awaited:
            return
        self._waiting += 1
        loop = asyncio.get_running_loop()
        self._awaited[host] = loop.call_later(
            self.replacement_timeout, lambda: self._spawn(self._replacement_overdue(host))
        )
        await self._event(
            f"awaiting a replacement pod for host {host} (up to {self.replacement_timeout:g} s)", host=host
        )

    async def _replacement_overdue(self, host: int) -> None:
        """No replacement joined in time (no capacity): the policy decides again, with no spare."""
        if self._awaited.pop(host, None) is None:
            return
        self._waiting -= 1
        self._no_capacity = True
        await self._event(
            f"no replacement for host {host} joined within {self.replacement_timeout:g} s "
            "(spec.health.replacementTimeoutSeconds): no capacity",
            host=host,
        )
        event = policy.HostLost(
            t=time.time(),
            step=self.memory.high_water,
            generation=self.memory.generation,
            host=host,
            machine="none",
        )
        await self._decide_and_act(event)

    async def _replacement_joined(
        self, host: int, message: dict[str, Any], writer: asyncio.StreamWriter
    ) -> None:
        """A pod with `host`'s identity registered after the job started: the operator's replacement."""
        if self.memory.state is JobState.SUCCEEDED:
            await send(writer, {"type": "shutdown"})  # too late: the job is over
            return
        if self.memory.state is JobState.FAILED:
            await send(writer, {"type": "fail", "reason": self.memory.failure_reason or "the job failed"})
            return
        old = self._members.get(host)
        if old is not None and old is not writer:
            old.close()  # a stale connection of the pod this one replaces
        machine = str(message.get("machine", f"host-{host}"))
        self.status[host] = HostStatus(
            state="stopped" if self.memory.state is JobState.STOPPING else "registered",
            metrics_port=message.get("metrics_port"),
            replica_address=message.get("replica_address"),
            machine=machine,
        )
        self._members[host] = writer
        self._no_capacity = False
        self.remediation.detector.reset(self.world.hosts)
        handle = self._awaited.pop(host, None)
        if handle is not None:
            handle.cancel()
            self._waiting -= 1
            self.memory.hot_swaps.append(
                {"host": host, "spare": None, "machine": machine, "generation": self.memory.generation}
            )
            await self._event(f"hot-swap: a new pod on {machine} takes over host {host}", host=host)
        else:
            await self._event(f"host {host} re-registered from {machine}", host=host)
        if self.memory.state is JobState.STOPPING:
            self._stopped.add(host)  # a newcomer has no workload to stop
            await self._start_when_all_stopped()
        elif host not in self.world.hosts:
            # A host of a dropped slice is back (capacity returned): the policy may scale back up.
            self._capacity_offer = True
            await self._offer_capacity()
        elif self.memory.state is JobState.RUNNING:
            # A new pod while the old one's connection was still open (a node lost without a word):
            await self._stop_job(host, "host_lost", f"host {host} re-registered while running", time.time())
            self._stopped.add(host)
            await self._start_when_all_stopped()

    async def _retire(self, host: int, reason: str) -> None:
        """A live machine leaves the job (replaced, e.g. a straggler): its supervisor ends."""
        writer = self._members.pop(host)
        await send(writer, {"type": "retire", "generation": self.memory.generation, "reason": reason})
        await self._event(f"host {host} ({self.status[host].machine}) retired: {reason}", host=host)

    async def _assign_spare(self, host: int, scale_up: bool = False) -> None:
        """Give a spare `host`'s identity: a hot-swap, or (`scale_up`) a dropped slice coming back."""
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
        if self.memory.state is JobState.STOPPING:
            self._stopped.add(host)  # a newcomer has no workload to stop and holds nothing yet
        self.remediation.detector.reset(self.world.hosts)  # the old machine's timings are not the new one's
        if not scale_up:
            self.memory.hot_swaps.append(
                {
                    "host": host,
                    "spare": spare.spare,
                    "machine": spare.machine,
                    "generation": self.memory.generation,
                }
            )
        fired = [record.spec for record in self.memory.faults if record.host == host]
        await send(
            spare.writer,
            {"type": "assign", "host": host, "generation": self.memory.generation, "fired": fired},
        )
        what = "scale-up" if scale_up else "hot-swap"
        await self._event(f"{what}: spare {spare.spare} ({spare.machine}) takes over host {host}", host=host)

    async def _start_when_all_stopped(self) -> None:
        """Start once every live active member acked its stop and no decision is still being taken."""
        if self.memory.state is not JobState.STOPPING or self._deciding or self._waiting:
            return
        live = {h for h in self.world.hosts if h in self._members}
        if live <= self._stopped:
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
            self.memory.persisted.get(step, set()).discard(host)
        elif tier == "any":
            status.invalid.add(step)  # every source of this host's shard failed at restore
        # peer: the holder simply lacks that copy, and its inventory at the next stop says so
        if message.get("reason") in ("save failed", "upload failed", "replication failed"):
            self.memory.failed_saves[tier] += 1
        await self._event(
            f"checkpoint of step {step} on host {host} invalid ({tier}): {message.get('detail', '')}",
            host=host,
        )

    async def _persisted_shard(self, host: int, step: int) -> None:
        """Commit a persistent step once every host's shard of it is uploaded, then apply retention."""
        uploaded = self.memory.persisted.setdefault(step, set())
        uploaded.add(host)
        if (
            not set(self.world.hosts) <= uploaded
            or self.persistent is None
            or step in self.memory.persistent_committed
        ):
            return
        try:
            await asyncio.to_thread(self.persistent.commit, step)
            await asyncio.to_thread(self.persistent.retain, self._persistent_keep)
        except (OSError, PersistentTierError) as error:
            self.memory.failed_saves[Tier.PERSISTENT] += 1
            await self._event(f"persistent checkpoint of step {step} not committed: {error}")
            return
        self.memory.persistent_committed = set(
            sorted({*self.memory.persistent_committed, step})[-self._persistent_keep :]
        )
        self.memory.persistent_owners[step] = set(uploaded)
        self.memory.persistent_commits.append({"step": step, "t": time.time()})
        for old in [s for s in self.memory.persisted if s <= step]:
            del self.memory.persisted[old]
        await self._event(f"persistent checkpoint of step {step} committed")
        await self._replicate()

    def _restored(self, host: int, message: dict[str, Any]) -> None:
        """A supervisor staged its host's shard of the agreed step into its local tier."""
        self.memory.restores.append(
            {
                "host": host,
                "step": int(message["step"]),
                "tier": message["tier"],
                "holder": message.get("holder"),
                "generation": self.memory.generation,
                "seconds": message.get("seconds"),
                "bytes": message.get("bytes"),
                "loaded_step": None,
            }
        )

    def _loaded(self, host: int, message: dict[str, Any]) -> None:
        """A workload says which step it restored: checked against the step its supervisor staged."""
        generation, step = int(message["generation"]), int(message["step"])
        for restore in reversed(self.memory.restores):
            if restore["host"] == host and restore["generation"] == generation:
                restore["loaded_step"] = step
                return
        # A workload that restored a step nobody staged for it (a loop restoring on its own).
        self.memory.restores.append(
            {
                "host": host,
                "step": None,
                "tier": None,
                "holder": None,
                "generation": generation,
                "loaded_step": step,
            }
        )

    def holdings(self) -> Holdings:
        return Holdings(
            local={h: set(s.committed) for h, s in self.status.items()},
            replicas={h: {o: set(v) for o, v in s.replicas.items()} for h, s in self.status.items()},
            persistent=set(self.memory.persistent_committed),
            invalid={h: set(s.invalid) for h, s in self.status.items()},
            job_invalid=set(self.memory.job_invalid),
            persistent_owners={s: set(o) for s, o in self.memory.persistent_owners.items()},
        )

    def restore_plan(self) -> RestorePlan:
        twins = {h: [t for t in self.world.twins(h) if t not in self._joined] for h in self._joined}
        return plan_restore(self.world.hosts, self.holdings(), live=self._members.keys(), twins=twins)

    async def _find_persistent_checkpoints(self) -> bool:
        """Before the first start: the steps earlier runs of this job committed to the persistent tier
        (a suspended job resumed, a job re-created under the same name, a leader started again).
        False when the tier cannot be read (the job failed: starting from scratch would silently
        throw away what it holds)."""
        if self.persistent is None:
            return True
        for attempt in range(1, PERSISTENT_LISTING_ATTEMPTS + 1):
            try:
                owners = await asyncio.to_thread(self.persistent.committed_owners)
                break
            except PersistentTierError as error:
                if attempt == PERSISTENT_LISTING_ATTEMPTS:
                    await self._fail(f"cannot read the persistent tier to find earlier checkpoints: {error}")
                    return False
                await asyncio.sleep(PERSISTENT_LISTING_BACKOFF * attempt)
        kept = sorted(owners)[-self._persistent_keep :]
        self.memory.persistent_committed = set(kept)
        self.memory.persistent_owners = {step: owners[step] for step in kept}
        if kept:
            newest = kept[-1]
            # Hosts whose shard the newest step lacks (it was saved by a scaled-down world) take a twin's.
            self._joined |= set(self.world.hosts) - owners[newest]
            await self._event(f"persistent tier: earlier runs committed step(s) {kept}")
        return True

    def _held(self) -> dict[str, Any]:
        """What the job held when it stopped, as the restore plan saw it (for the report)."""
        holdings = self.holdings()
        live = set(self._members)
        return {
            "live": sorted(live),
            "local": {str(h): sorted(steps) for h, steps in holdings.local.items() if steps and h in live},
            "replicas": {
                str(holder): {str(owner): sorted(steps) for owner, steps in owners.items() if steps}
                for holder, owners in holdings.replicas.items()
                if holder in live and any(owners.values())
            },
            "persistent": {
                str(step): sorted(holdings.persistent_owners.get(step, set(range(self.hosts))))
                for step in sorted(holdings.persistent)
            },
            "invalid": {str(h): sorted(steps) for h, steps in holdings.invalid.items() if steps},
            "job_invalid": sorted(holdings.job_invalid),
            "rejoining": sorted(self._joined),
        }

    def _record_recovery(self, restore_step: int | None, held: dict[str, Any], *, resumed: bool) -> None:
        cause = self.memory.stop_cause or {}
        restored = restore_step or 0
        high_water = restored if resumed else int(cause.get("high_water", self.memory.high_water))
        self.memory.recoveries.append(
            {
                "generation": self.memory.generation,
                "cause": "resume" if resumed else cause.get("kind"),
                "host": None if resumed else cause.get("host"),
                "stopped_at": None if resumed else cause.get("t"),
                "high_water": high_water,
                "restore_step": restore_step,
                "steps_replayed": max(0, high_water - restored),
                "world": list(self.world.hosts),
                "held": held,
            }
        )

    def _acks_overdue(self, generation: int) -> None:
        if self.memory.state is JobState.STOPPING and self.memory.generation == generation:
            missing = sorted(set(self.world.hosts) & self._members.keys() - self._stopped)
            if not missing:
                return  # all stopped; the start waits for a decision (a policy's Wait), not for acks
            reason = f"host(s) {missing} did not stop their workload within {STOP_ACK_SECONDS:.0f} s"
            self._overdue = asyncio.ensure_future(self._fail(reason))

    async def _start(self) -> None:
        if self._ack_deadline is not None:
            self._ack_deadline.cancel()
        first = self.memory.state is JobState.REGISTERING
        if first:
            if self._first_start_under_way:
                return  # a second call while the first one reads the persistent tier
            self._first_start_under_way = True
            found = await self._find_persistent_checkpoints()
            self._first_start_under_way = False
            if not found or self.memory.state is not JobState.REGISTERING:
                return
        missing = [h for h in self.world.hosts if h not in self._members]
        if missing:
            if first:
                return  # a host was lost while the tier was read: the next registration starts the job
            await self._fail(
                f"host(s) {missing} have no machine, and the policy decided neither a replacement nor a "
                "scale-down for them"
            )
            return
        plan = self.restore_plan()
        held = self._held()
        if not first:
            self.memory.generation += 1
        restore_step = plan.step
        if not first or restore_step is not None:
            self._record_recovery(restore_step, held, resumed=first)
        if first and restore_step is not None:
            self.memory.high_water = restore_step  # the steps an earlier run completed
        self._joined.clear()

        def keep(step: int) -> bool:
            # Steps newer than the restore belong to an abandoned timeline: every tier drops them.
            return restore_step is not None and step <= restore_step

        for status in self.status.values():
            status.committed = {s for s in status.committed if keep(s)}
            status.replicas = {o: {s for s in v if keep(s)} for o, v in status.replicas.items()}
            status.invalid = {s for s in status.invalid if keep(s)}  # a re-saved step is a new one
        self.memory.job_invalid = {s for s in self.memory.job_invalid if keep(s)}
        self.memory.persisted = {s: h for s, h in self.memory.persisted.items() if keep(s)}
        self.memory.persistent_committed = {s for s in self.memory.persistent_committed if keep(s)}
        if self.memory.detections:
            self.memory.detections[-1].restore_step = restore_step
        self.memory.state = JobState.RUNNING
        self._progress_this_generation = False
        self._finished.clear()
        self.world.record(self.memory.high_water, self.memory.generation)
        self.remediation.new_world()
        await self._replicate()
        world = self.world.hosts
        address = self._coordinator_address(self.memory.generation, world[0])
        addresses = {h: s.replica_address for h, s in self.status.items() if s.replica_address}
        for host, writer in list(self._members.items()):
            if host not in world:
                self.status[host].state = "parked"
                await send(
                    writer,
                    {"type": "park", "generation": self.memory.generation, "restore_step": restore_step},
                )
                continue
            self.status[host].state = "starting"
            await send(
                writer,
                {
                    "type": "start",
                    "generation": self.memory.generation,
                    "coordinator": address,
                    "restore_step": restore_step,
                    "sources": [src.to_message(addresses) for src in plan.sources.get(host, ())],
                    "replica_addresses": addresses,
                    "world": world,
                    "rank": world.index(host),
                },
            )
        if restore_step is None and not first:
            where = "from scratch: no checkpoint step is complete across the hosts"
        elif first and restore_step is not None:
            where = f"from step {restore_step} of an earlier run (persistent tier)"
        else:
            where = f"from step {restore_step}" if restore_step is not None else "from scratch"
        size = f" on {len(world)} of {self.hosts} hosts" if len(world) < self.hosts else ""
        await self._event(
            f"generation {self.memory.generation} starting {where}{size}", generation=self.memory.generation
        )

    async def _succeed(self) -> None:
        self.memory.state = JobState.SUCCEEDED
        self.write_summary()
        await self._event("training finished on every host")
        await self._replicate()
        await self._broadcast({"type": "shutdown"})
        for spare in self._spares:
            await send(spare.writer, {"type": "shutdown"})
        self.done.set()

    async def _fail(self, reason: str) -> None:
        if self.memory.state in (JobState.SUCCEEDED, JobState.FAILED):
            return
        self.memory.state = JobState.FAILED
        self.memory.failure_reason = reason
        self.write_summary()
        await self._event(f"job failed: {reason}")
        await self._replicate()
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
            "state": self.memory.state.value,
            "generation": self.memory.generation,
            "restarts": dict(self.memory.restarts),
            "hosts": hosts,
        }

    def cluster_status(self) -> dict[str, Any]:
        """The job as the TrainingJob's status shows it (published on the leader's pod in a cluster)."""
        return {
            "state": self.memory.state.value,
            "generation": self.memory.generation,
            "step": self.memory.high_water,
            "slicesActive": len(self.world.active),
            "restarts": dict(self.memory.restarts),
            "hotSwaps": len(self.memory.hot_swaps),
            "lastCheckpointStep": self.restore_plan().step,  # the newest step every shard restores from
            "lastRestore": self._last_restore(),
            "awaitingReplacement": sorted(self._awaited),
            "failureReason": self.memory.failure_reason,
        }

    def _last_restore(self) -> dict[str, Any] | None:
        if not self.memory.recoveries:
            return None
        last = self.memory.recoveries[-1]
        return {
            "generation": last["generation"],
            "cause": last["cause"],
            "step": last["restore_step"],
            "stepsReplayed": last["steps_replayed"],
        }

    def summary(self) -> dict[str, Any]:
        fingerprints = {h: m.get("fingerprint") for h, m in self._finished.items()}
        return {
            "state": self.memory.state.value,
            "failure_reason": self.memory.failure_reason,
            "generations": self.memory.generation + 1,
            "restarts": dict(self.memory.restarts),
            "faults": [vars(f) for f in self.memory.faults],
            "detections": [vars(d) for d in self.memory.detections],
            "fingerprints": fingerprints,
            "steps_completed": self.memory.high_water,
            "metrics_ports": {h: s.metrics_port for h, s in self.status.items()},
            "restores": self.memory.restores,
            "recoveries": self.memory.recoveries,
            "hot_swaps": self.memory.hot_swaps,
            "persistent_committed": sorted(self.memory.persistent_committed),
            "persistent_commits": self.memory.persistent_commits,
            "failed_saves": dict(self.memory.failed_saves),
            "machines": {h: s.machine for h, s in self.status.items()},
            "decisions": self.remediation.decisions,
            "stragglers": self.remediation.stragglers,
            "world": self.world.history,
            "scale_events": self.remediation.scale_events,
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
