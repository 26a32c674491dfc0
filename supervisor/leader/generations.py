"""The restart state machine's driver: carries out what `leader.restart_machine` decides.

The transitions themselves are pure (leader.restart_machine): this module reads the machine's state
from the job's memory and its own bookkeeping, feeds it each event, writes the new state back and
carries out the commands in order: the journal written, the members told, the ack deadline armed
through the leader's background work (fenced, its failure an outcome), a generation started (the
restore plan chosen, a fresh coordinator address, each host's sources), the job ended. What a command
leads to (the start done or given up) comes back as an event.

Hosts of a dropped slice get `park` instead of `start`. What changes who takes part (a replacement,
a scale-down or up) is decided and applied while the job is stopped (leader.remediation); the start
waits for it: whatever must finish first holds the start (`hold`/`release`: a decision under way, a
policy's `Wait`, a leader carrying on a journal), and so does a replacement on its way (the capacity).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader import restart_machine as machine
from slicekeeper.supervisor.leader import restart_records
from slicekeeper.supervisor.leader.background import BackgroundWork, Task
from slicekeeper.supervisor.leader.capacity import Replacement
from slicekeeper.supervisor.leader.checkpoints import Checkpoints
from slicekeeper.supervisor.leader.decisions import Decisions
from slicekeeper.supervisor.leader.journal import Detection, JobMemory, JobState, JournalWriter
from slicekeeper.supervisor.leader.members import HostStatus, Members
from slicekeeper.supervisor.leader.restart_rule import RestartRule
from slicekeeper.supervisor.leader.starts import StartMessages
from slicekeeper.supervisor.world import JobWorld

from slicekeeper.policy.events import FaultKind

STOP_ACK_SECONDS = 30.0
"""How long every member gets to kill its workload and ack a stop before the job fails."""


class Generations:
    def __init__(
        self,
        *,
        memory: JobMemory,
        world: JobWorld,
        members: Members,
        status: dict[int, HostStatus],
        checkpoints: Checkpoints,
        journal: JournalWriter,
        capacity: Replacement,
        rule: RestartRule,
        decisions: Decisions,
        background: BackgroundWork,
        coordinator_address: Callable[[int, int], str],
        ended: Callable[[], None],
        peer_replicas: int | None = None,
    ) -> None:
        """`peer_replicas`: hosts that keep each host's replicas (a start tells each host the addresses
        of its own; None: every host's)."""
        self.memory = memory
        self.world = world
        self.members = members
        self.status = status
        self.checkpoints = checkpoints
        self.journal = journal
        self.capacity = capacity
        self.rule = rule
        self.decisions = decisions
        self.background = background
        self._starts = StartMessages(world.shape, coordinator_address, peer_replicas)
        self._ended = ended
        """The job succeeded or failed: write the summary."""
        self.done = asyncio.Event()
        self._holds: Counter[str] = Counter()
        """What holds the next start, by why: no start while any is held."""
        self.finished: dict[int, messages.Finished] = {}
        self._stopped: frozenset[int] = frozenset()
        self._progressed = False
        self._starting = False
        self._ack_deadline: asyncio.TimerHandle | None = None
        self._acks: dict[int, set[int]] = {}
        """generation -> the hosts whose stop acknowledgement is not yet taken in (`_take_acks`)."""

    # --- the machine's state, read from and written back to the job's memory -----------------
    def state(self) -> machine.RestartState:
        return machine.RestartState(
            phase=self.memory.state,
            generation=self.memory.generation,
            stopped=self._stopped,
            finished=frozenset(self.finished),
            progressed=self._progressed,
            restarts=sum(self.memory.restarts.values()),
            restarts_without_progress=self.memory.restarts_without_progress,
            ack_deadline=self._ack_deadline is not None,
            starting=self._starting,
            failure_reason=self.memory.failure_reason,
        )

    def _store(self, state: machine.RestartState) -> None:
        self.memory.state = state.phase
        self.memory.generation = state.generation
        self.memory.restarts_without_progress = state.restarts_without_progress
        self.memory.failure_reason = state.failure_reason
        self._stopped = state.stopped
        self._progressed = state.progressed
        self._starting = state.starting

    def _readiness(self) -> machine.Readiness:
        holding = bool(self._holds) or bool(self.capacity.awaiting())
        return machine.Readiness(frozenset(self.members.live()), tuple(self.world.hosts), holding)

    def hold(self, why: str) -> None:
        """No start until `release(why)` (as often as held)."""
        self._holds[why] += 1

    def release(self, why: str) -> None:
        self._holds[why] -= 1
        if self._holds[why] <= 0:
            del self._holds[why]

    def held(self, why: str) -> bool:
        return self._holds[why] > 0

    async def _feed(self, event: machine.Event) -> machine.RestartState:
        """Apply `event`: the new state written back, then its commands carried out in order."""
        state, commands = machine.transition(self.state(), event, self.rule)
        self._store(state)
        for command in commands:
            await self._carry_out(command)
        return state

    async def _carry_out(self, command: machine.Command) -> None:
        match command:
            case machine.RecordStop():
                await self._record_stop(command)
            case machine.WriteJournal():
                await self.journal.write()
            case machine.SendStop(generation=generation, kind=kind, host=host, to=to):
                stop = messages.Stop(generation=generation, kind=kind, host=host)
                for member in to:
                    if member in self.members:
                        await self.members.send(member, stop)
            case machine.ArmAckDeadline(generation=generation):
                self._cancel_ack_deadline()
                self._ack_deadline = self.background.later(
                    STOP_ACK_SECONDS, Task.ACK_DEADLINE, lambda: self._acks_overdue(generation)
                )
            case machine.CancelAckDeadline():
                self._cancel_ack_deadline()
            case machine.StartGeneration():
                await self._start()
            case machine.EndJob(succeeded=succeeded, reason=reason):
                await self._end(succeeded, reason)

    def _cancel_ack_deadline(self) -> None:
        if self._ack_deadline is not None:
            self._ack_deadline.cancel()
            self._ack_deadline = None

    # --- what the rest of the leader tells it ------------------------------------------------
    @property
    def over(self) -> bool:
        return self.memory.state in (JobState.SUCCEEDED, JobState.FAILED)

    @property
    def progressed(self) -> bool:
        """The running generation completed a step."""
        return self._progressed

    async def stop(self, host: int, kind: FaultKind, detail: str, now: float, planned: bool = False) -> bool:
        """Turn a fault of the running generation into a stop of every host; False if the job failed
        (or was not running). `planned`: a stop the policy chose with nothing broken (a scale-up): no
        restart limit applies."""
        event = machine.FaultStop(
            host, kind, detail, now, frozenset(self.members.live()), tuple(self.world.hosts), planned
        )
        state = await self._feed(event)
        return state.phase is JobState.STOPPING

    async def acked(self, report: messages.Stopped) -> None:
        if report.generation != self.memory.generation or self.memory.state is not JobState.STOPPING:
            return
        self.checkpoints.stopped(report)
        self.status[report.host].state = "stopped"
        acks = self._acks.setdefault(report.generation, set())
        acks.add(report.host)
        if len(acks) == 1:  # the first of a batch
            self.background.spawn(Task.STOP_ACKS, self._take_acks(report.generation))

    async def _take_acks(self, generation: int) -> None:
        """The stop acknowledgements read so far, to the machine at once: thousands of members ack
        within moments, and what the start condition costs to check grows with the job's size (per
        ack, that would be the square of it)."""
        await asyncio.sleep(0)  # the acks read in the same turn of the event loop join the batch
        hosts = frozenset(self._acks.pop(generation, ()))
        await self._feed(machine.StopAcked(hosts, generation, self._readiness()))

    def no_workload(self, host: int) -> None:
        """`host` has no workload to stop (a new machine serves it, or its slice comes back)."""
        state, _ = machine.transition(self.state(), machine.NoWorkload(host), self.rule)
        self._store(state)

    def member_lost(self, host: int) -> None:
        state, _ = machine.transition(self.state(), machine.MemberLost(host), self.rule)
        self._store(state)

    def progress(self) -> None:
        """A step of the running generation completed."""
        state, _ = machine.transition(self.state(), machine.Progressed(), self.rule)
        self._store(state)

    async def finished_on(self, report: messages.Finished) -> None:
        if report.generation != self.memory.generation or self.memory.state is not JobState.RUNNING:
            return
        self.finished[report.host] = report
        self.status[report.host].state = "finished"
        await self._feed(machine.HostFinished(report.host, report.generation, tuple(self.world.hosts)))

    async def _acks_overdue(self, generation: int) -> None:
        self._ack_deadline = None
        await self._feed(machine.AckDeadlinePassed(generation, self._readiness(), STOP_ACK_SECONDS))

    async def start_when_all_stopped(self) -> None:
        """Start once every live active member acked its stop and no decision is still being taken."""
        await self._feed(machine.Reconsider(self._readiness()))

    async def start(self) -> None:
        """The first start: every host registered."""
        await self._feed(machine.AllRegistered())

    async def fail(self, reason: str) -> None:
        await self._feed(machine.JobFails(reason))

    # --- carrying out -----------------------------------------------------------------------
    async def _record_stop(self, stop: machine.RecordStop) -> None:
        now = stop.t
        if not stop.refused:
            self.memory.restarts[stop.kind] += 1
            self.memory.stop_cause = {
                "kind": stop.kind,
                "host": stop.host,
                "t": now,
                "high_water": self.memory.high_water,
                "planned": stop.planned,
            }
        for record in self.memory.faults if not stop.planned else []:
            if record.detected_at is None and record.generation == stop.generation and record.disruptive:
                record.detected_at, record.detected_as = now, stop.kind
                self.memory.detected(record, stop.generation)
        if stop.planned:
            await self.members.event(f"stopping every host: {stop.detail} ({stop.kind})", kind=stop.kind)
        else:
            self.memory.detections.append(Detection(stop.kind, stop.host, stop.generation, now, stop.detail))
            await self.members.event(
                f"{stop.kind} detected on host {stop.host}: {stop.detail}", host=stop.host, kind=stop.kind
            )

    async def _start(self) -> None:
        first = self.memory.state is JobState.REGISTERING
        if first:
            unreadable = await self.checkpoints.find_persistent()
            if unreadable is not None:
                await self._feed(machine.JobFails(unreadable))
                return
            if self.memory.state is not JobState.REGISTERING:
                return
        missing = [h for h in self.world.hosts if h not in self.members]
        if missing:
            if first:
                # a host was lost while the tier was read: the next registration starts the job
                await self._feed(machine.StartAbandoned())
                return
            await self._feed(
                machine.JobFails(
                    f"host(s) {missing} have no machine, and the policy decided neither a replacement "
                    "nor a scale-down for them"
                )
            )
            return
        plan = self.checkpoints.restore_plan()
        held = self.checkpoints.held()
        self.finished.clear()
        generation = self.memory.generation if first else self.memory.generation + 1
        await self._feed(machine.Started(generation))
        restore_step = plan.step
        if not first or restore_step is not None:
            self._record_recovery(restore_step, held, resumed=first)
        if first and restore_step is not None:
            self.memory.high_water = restore_step  # the steps an earlier run completed
        self.checkpoints.abandon_after(restore_step)
        if self.memory.detections:
            self.memory.detections[-1].restore_step = restore_step
        self.world.record(self.memory.high_water, self.memory.generation)
        self.decisions.new_world()
        await self.journal.write()
        addresses = {h: s.replica_address for h, s in self.status.items() if s.replica_address}
        starts = self._starts.for_world(generation, self.world.hosts, restore_step, plan, addresses)
        for host in sorted(self.members.live()):
            start = starts.get(host)
            if start is None:
                self.status[host].state = "parked"
                await self.members.send(host, messages.Park(generation=generation, restore_step=restore_step))
                continue
            self.status[host].state = "starting"
            await self.members.send(host, start)
        await self.members.event(
            f"generation {generation} starting {_where(first, restore_step)}{self._size()}",
            generation=generation,
        )

    def _size(self) -> str:
        active, full = len(self.world.hosts), self.world.full_hosts
        return f" on {active} of {full} hosts" if active < full else ""

    def _record_recovery(self, restore_step: int | None, held: dict[str, Any], *, resumed: bool) -> None:
        cause = self.memory.stop_cause or {}
        restored = restore_step or 0
        # The hosts train on until they are stopped: a planned stop (a scale-up) recorded at step 88 may
        # restore a step 90 committed meanwhile, which was reached too.
        stopped_at = int(cause.get("high_water", self.memory.high_water))
        high_water = restored if resumed else max(stopped_at, restored)
        self.memory.recoveries.append(
            {
                "generation": self.memory.generation,
                "cause": "resume" if resumed else cause.get("kind"),
                "host": None if resumed else cause.get("host"),
                "stopped_at": None if resumed else cause.get("t"),
                "high_water": high_water,
                "restore_step": restore_step,
                "steps_replayed": max(0, high_water - restored),
                "world": restart_records.world(list(self.world.hosts)),
                "held": restart_records.held(held, len(self.world.hosts)),
            }
        )

    async def _end(self, succeeded: bool, reason: str | None) -> None:
        self._ended()
        if succeeded:
            await self.members.event("training finished on every host")
        else:
            await self.members.event(f"job failed: {reason}")
        await self.journal.write()
        end = messages.Shutdown() if succeeded else messages.Failed(reason=reason or "")
        await self.members.broadcast(end)
        await self.capacity.release()
        self.done.set()


def _where(first: bool, restore_step: int | None) -> str:
    if restore_step is None and not first:
        return "from scratch: no checkpoint step is complete across the hosts"
    if first and restore_step is not None:
        return f"from step {restore_step} of an earlier run (persistent tier)"
    return f"from step {restore_step}" if restore_step is not None else "from scratch"
