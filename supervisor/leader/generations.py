"""The restart state machine's driver: carries out what `leader.restart_machine` decides.

The transitions are pure (leader.restart_machine); the machine's state is one value in the job's
memory (`JobMemory.restart`), written here alone. Every part of the leader sends the driver events
(`send`): they wait in one queue and are taken one at a time, never re-entered. An event's
transition gives the new state and commands; each command is carried out by its one applier, in
order: the journal written, the members told, the ack deadline armed through the leader's background
work (fenced, its failure an outcome), a start checked (the persistent tier read before the first
start, the hosts with no machine), a generation launched (the restore plan chosen, a fresh
coordinator address, each host's sources), the job ended. What a command finds out goes back into
the queue as an event (`StartChecked`), taken after the commands under way; a command that raises
fails the job with the reason, so none is dropped unseen.

Hosts of a dropped slice get `park` instead of `start`. What changes who takes part (a replacement,
a scale-down or up) is decided and applied while the job is stopped (leader.remediation); the start
waits for it: whatever must finish first holds the start (`Hold`/`Release` events: a decision under
way, a policy's `Wait`, a leader carrying on a journal), and so does a replacement on its way (the
capacity). An event that needs the facts of its turn (who is live, which hosts take part) is sent as
a function that makes it (`fault_stop`, `reconsider`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader import restart_events, restart_records
from slicekeeper.supervisor.leader import restart_machine as machine
from slicekeeper.supervisor.leader import status as views
from slicekeeper.supervisor.leader.admission import HostState
from slicekeeper.supervisor.leader.background import Task
from slicekeeper.supervisor.leader.context import LeaderContext
from slicekeeper.supervisor.leader.journal import Detection
from slicekeeper.supervisor.leader.restart_rule import RestartRule
from slicekeeper.supervisor.leader.restart_state import Readiness, RestartState
from slicekeeper.supervisor.leader.starts import StartMessages

from slicekeeper.policy.events import FaultKind

Happening = restart_events.Event | Callable[[], restart_events.Event]
"""An event for the machine, or what makes it from the facts of when its turn comes."""

ACK_BATCH_SECONDS = 0.05
"""How long a batch of stop acknowledgements waits for more before the machine takes it
(`Generations._take_acks`)."""
STOP_ACK_SECONDS = 30.0
"""How long every member gets to kill its workload and ack a stop before the job fails."""


@dataclass(frozen=True)
class Answer:
    """What an event came to: the machine's state after it, and what it asks the event's sender to do."""

    state: RestartState
    requests: tuple[restart_events.Request, ...]


class Generations:
    def __init__(
        self,
        context: LeaderContext,
        *,
        rule: RestartRule,
        coordinator_address: Callable[[int, int], str],
        summary_path: Path | None = None,
        peer_replicas: int | None = None,
    ) -> None:
        """`summary_path`: where the job's summary is written once it ends (None: nowhere).
        `peer_replicas`: hosts that keep each host's replicas (a start tells each host the addresses
        of its own; None: every host's)."""
        self.context = context
        self.rule = rule
        self._starts = StartMessages(context.world.shape, coordinator_address, peer_replicas)
        self._summary_path = summary_path
        self.done = asyncio.Event()
        self.finished: dict[int, messages.Finished] = {}
        """The reports of the hosts that finished the running generation (their fingerprints)."""
        self._ack_deadline: asyncio.TimerHandle | None = None
        self._acks: dict[int, set[int]] = {}
        """generation -> the hosts whose stop acknowledgement is not yet taken in (`_take_acks`)."""
        self._acks_complete = asyncio.Event()
        """Set when the batch being gathered may complete the world (`acked`)."""
        self._queue: deque[tuple[Happening, asyncio.Future[Answer] | None]] = deque()
        """Events waiting for the machine, in the order they were sent; taken one at a time."""
        self._draining = False
        self._appliers: dict[type, Callable[[Any], Awaitable[None]]] = {
            restart_events.RecordStop: self._record_stop,
            restart_events.WriteJournal: self._write_journal,
            restart_events.SendStop: self._send_stop,
            restart_events.ArmAckDeadline: self._arm_ack_deadline,
            restart_events.CancelAckDeadline: self._cancel_ack_deadline,
            restart_events.StartGeneration: self._check_start,
            restart_events.LaunchGeneration: self._launch,
            restart_events.EndJob: self._end,
        }
        """One applier per command the machine gives, by the command's type."""

    # --- the one queue of events --------------------------------------------------------------
    async def send(self, event: Happening) -> RestartState:
        """Queue `event` for the machine and return the state once it and its commands are done. An
        event made from facts (`Readiness`) is given as a function that makes it, called when its
        turn comes, so that it reads the facts of then."""
        return (await self._queued(event)).state

    async def ask(self, event: Happening) -> tuple[restart_events.Request, ...]:
        """Send `event` and return what the machine asks its sender to do (the requests), in order,
        once the driver's own commands are done."""
        return (await self._queued(event)).requests

    async def _queued(self, event: Happening) -> Answer:
        answered: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._queue.append((event, answered))
        if not self._draining:
            await self._drain()
        return await answered

    def _post(self, event: Happening) -> None:
        """From inside a command: what it led to, taken after the commands of the event under way."""
        self._queue.append((event, None))

    async def _drain(self) -> None:
        """Take the queued events one at a time: the transition, its state written, then each of its
        commands carried out by its applier. Never re-entered: an event sent meanwhile waits its turn.
        A command that raises fails the job with the reason (it is never dropped unseen)."""
        self._draining = True
        try:
            while self._queue:
                happening, answered = self._queue.popleft()
                event = happening() if callable(happening) else happening
                state, commands = machine.transition(self.context.memory.restart, event, self.rule)
                self.context.memory.restart = state
                requests: list[restart_events.Request] = []
                for command in commands:
                    if isinstance(command, restart_events.Request):
                        requests.append(command)
                        continue
                    try:
                        await self._appliers[type(command)](command)
                    except Exception as error:
                        what = f"carrying out {type(command).__name__} of {type(event).__name__}"
                        self.context.background.spawn(
                            Task.OUTCOME, self.context.background.failed(Task.RESTART, error, what)
                        )
                if answered is not None:
                    answered.set_result(Answer(self.context.memory.restart, tuple(requests)))
                elif requests:  # an event a command led to has no sender: its requests fail the job
                    unasked = RuntimeError(f"{type(event).__name__} asked {requests} of no sender")
                    self.context.background.spawn(
                        Task.OUTCOME, self.context.background.failed(Task.RESTART, unasked, "draining")
                    )
        finally:
            self._draining = False
            if self._queue:  # the taker was cancelled: the events left still get their turn
                self.context.background.spawn(Task.RESTART, self._drain())

    def _readiness(self) -> Readiness:
        return Readiness(
            frozenset(self.context.members.live()),
            tuple(self.context.world.hosts),
            bool(self.context.capacity.awaiting()),
        )

    # --- the appliers -------------------------------------------------------------------------
    async def _write_journal(self, command: restart_events.WriteJournal) -> None:
        await self.context.journal.write()

    async def _send_stop(self, command: restart_events.SendStop) -> None:
        stop = messages.Stop(generation=command.generation, kind=command.kind, host=command.host)
        await self.context.members.send_each(command.to, stop)

    async def _arm_ack_deadline(self, command: restart_events.ArmAckDeadline) -> None:
        self._disarm()
        generation = command.generation
        self._ack_deadline = self.context.background.later(
            STOP_ACK_SECONDS, Task.ACK_DEADLINE, lambda: self._acks_overdue(generation)
        )

    async def _cancel_ack_deadline(self, command: restart_events.CancelAckDeadline) -> None:
        self._disarm()

    def _disarm(self) -> None:
        if self._ack_deadline is not None:
            self._ack_deadline.cancel()
            self._ack_deadline = None

    async def _acks_overdue(self, generation: int) -> None:
        self._ack_deadline = None
        await self.take_acks()
        await self.send(
            lambda: restart_events.AckDeadlinePassed(generation, self._readiness(), STOP_ACK_SECONDS)
        )

    # --- what the rest of the leader tells it ------------------------------------------------
    @property
    def over(self) -> bool:
        return self.context.memory.restart.over

    @property
    def progressed(self) -> bool:
        """The running generation completed a step."""
        return self.context.memory.restart.progressed

    def fault_stop(
        self, host: int, kind: FaultKind, detail: str, now: float, planned: bool = False
    ) -> Happening:
        """A fault of the running generation, with the members live when its turn comes: a stop of
        every host. `planned`: a stop the policy chose with nothing broken (a scale-up): no restart
        limit applies."""

        def fault() -> restart_events.FaultStop:
            live, world = frozenset(self.context.members.live()), tuple(self.context.world.hosts)
            return restart_events.FaultStop(host, kind, detail, now, live, world, planned)

        return fault

    def reconsider(self) -> Happening:
        """Look at the start again (a decision in, a member back), with the facts of its turn."""
        return lambda: restart_events.Reconsider(self._readiness())

    async def acked(self, report: messages.Stopped) -> None:
        if not self.context.memory.restart.stops(report.generation):
            return
        self.context.checkpoints.stopped(report)
        self.context.status[report.host].state = HostState.STOPPED
        acks = self._acks.setdefault(report.generation, set())
        acks.add(report.host)
        if len(acks) == 1:  # the first of a batch
            self._acks_complete = asyncio.Event()
            self.context.background.spawn(Task.STOP_ACKS, self._take_acks(report.generation))
        if len(acks) + len(self.context.memory.restart.stopped) >= len(self.context.world.hosts):
            self._acks_complete.set()  # it may complete the world: no need to wait for more

    async def _take_acks(self, generation: int) -> None:
        """The stop acknowledgements read so far, to the machine at once: thousands of members ack
        within moments (a relay's group in one line), and what the start condition costs to check
        grows with the job's size (per ack, that would be the square of it). A batch takes what comes
        in ACK_BATCH_SECONDS, unless it may complete the world before: at 25,000 hosts behind 391
        relays, a few batches instead of one per relay."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._acks_complete.wait(), ACK_BATCH_SECONDS)
        await self._take(generation)

    async def take_acks(self) -> None:
        """The acknowledgements not yet taken, to the machine now (before its deadline is judged,
        and before a member's loss: an acknowledgement never comes after its host's end)."""
        for generation in list(self._acks):
            await self._take(generation)

    async def _take(self, generation: int) -> None:
        hosts = frozenset(self._acks.pop(generation, ()))
        if hosts:
            await self.send(lambda: restart_events.StopAcked(hosts, generation, self._readiness()))

    async def finished_on(self, report: messages.Finished) -> None:
        if not self.context.memory.restart.runs(report.generation):
            return
        self.finished[report.host] = report
        self.context.status[report.host].state = HostState.FINISHED
        await self.send(
            lambda: restart_events.HostFinished(
                report.host, report.generation, tuple(self.context.world.hosts)
            )
        )

    # --- carrying out -----------------------------------------------------------------------
    async def _record_stop(self, stop: restart_events.RecordStop) -> None:
        now = stop.t
        if not stop.refused:
            self.context.memory.restarts[stop.kind] += 1
            self.context.memory.stop_cause = {
                "kind": stop.kind,
                "host": stop.host,
                "t": now,
                "high_water": self.context.memory.high_water,
                "planned": stop.planned,
            }
        for record in self.context.memory.faults if not stop.planned else []:
            if record.detected_at is None and record.generation == stop.generation and record.disruptive:
                record.detected_at, record.detected_as = now, stop.kind
                self.context.memory.detected(record, stop.generation)
        if stop.planned:
            await self.context.members.event(
                f"stopping every host: {stop.detail} ({stop.kind})", kind=stop.kind
            )
        else:
            self.context.memory.detections.append(
                Detection(stop.kind, stop.host, stop.generation, now, stop.detail)
            )
            await self.context.members.event(
                f"{stop.kind} detected on host {stop.host}: {stop.detail}", host=stop.host, kind=stop.kind
            )

    async def _check_start(self, command: restart_events.StartGeneration) -> None:
        """Before the first start, the persistent tier is read (a job may resume an earlier run's
        step); the machine then hears which active hosts have no machine, as of its turn."""
        unreadable = await self.context.checkpoints.find_persistent() if command.first else None
        self._post(
            lambda: restart_events.StartChecked(
                tuple(h for h in self.context.world.hosts if h not in self.context.members), unreadable
            )
        )

    async def _launch(self, command: restart_events.LaunchGeneration) -> None:
        generation, first = command.generation, command.first
        plan = self.context.checkpoints.restore_plan()
        held = self.context.checkpoints.held()
        self.finished.clear()
        restore_step = plan.step
        if not first or restore_step is not None:
            self._record_recovery(restore_step, held, resumed=first)
        if first and restore_step is not None:
            self.context.memory.high_water = restore_step  # the steps an earlier run completed
        self.context.checkpoints.abandon_after(restore_step)
        if self.context.memory.detections:
            self.context.memory.detections[-1].restore_step = restore_step
        self.context.world.record(self.context.memory.high_water, generation)
        self.context.decisions.new_world()
        await self.context.journal.write()
        addresses = {h: s.replica_address for h, s in self.context.status.items() if s.replica_address}
        starts = self._starts.for_world(generation, self.context.world.hosts, restore_step, plan, addresses)
        starting = {}
        for host in sorted(self.context.members.live()):
            own = starts.each.get(host)
            if own is None:
                self.context.status[host].state = HostState.PARKED
                await self.context.members.send(
                    host, messages.Park(generation=generation, restore_step=restore_step)
                )
                continue
            self.context.status[host].state = HostState.STARTING
            starting[host] = own
        await self.context.members.send_own(starts.common, starting)
        await self.context.members.event(
            f"generation {generation} starting {_where(first, restore_step)}{self._size()}",
            generation=generation,
        )

    def _size(self) -> str:
        active, full = len(self.context.world.hosts), self.context.world.full_hosts
        return f" on {active} of {full} hosts" if active < full else ""

    def _record_recovery(self, restore_step: int | None, held: dict[str, Any], *, resumed: bool) -> None:
        cause = self.context.memory.stop_cause or {}
        restored = restore_step or 0
        # The hosts train on until they are stopped: a planned stop (a scale-up) recorded at step 88 may
        # restore a step 90 committed meanwhile, which was reached too.
        stopped_at = int(cause.get("high_water", self.context.memory.high_water))
        high_water = restored if resumed else max(stopped_at, restored)
        self.context.memory.recoveries.append(
            {
                "generation": self.context.memory.generation,
                "cause": "resume" if resumed else cause.get("kind"),
                "host": None if resumed else cause.get("host"),
                "stopped_at": None if resumed else cause.get("t"),
                "high_water": high_water,
                "restore_step": restore_step,
                "steps_replayed": max(0, high_water - restored),
                "world": restart_records.world(list(self.context.world.hosts)),
                "held": restart_records.held(held, len(self.context.world.hosts)),
            }
        )

    async def _end(self, command: restart_events.EndJob) -> None:
        succeeded, reason = command.succeeded, command.reason
        self._write_summary()
        if succeeded:
            await self.context.members.event("training finished on every host")
        else:
            await self.context.members.event(f"job failed: {reason}")
        await self.context.journal.write()
        end = messages.Shutdown() if succeeded else messages.Failed(reason=reason or "")
        await self.context.members.broadcast(end)
        await self.context.capacity.release()
        self.done.set()

    def summary(self) -> dict[str, Any]:
        """The job's summary (leader.status): the report's source."""
        fingerprints = {h: f.fingerprint for h, f in self.finished.items()}
        context = self.context
        return views.summary(context.memory, context.world, context.status, context.decisions, fingerprints)

    def _write_summary(self) -> None:
        if self._summary_path is not None and self.context.members.leading():  # a fenced leader: nothing
            self._summary_path.write_text(json.dumps(self.summary(), indent=1))


def _where(first: bool, restore_step: int | None) -> str:
    if restore_step is None and not first:
        return "from scratch: no checkpoint step is complete across the hosts"
    if first and restore_step is not None:
        return f"from step {restore_step} of an earlier run (persistent tier)"
    return f"from step {restore_step}" if restore_step is not None else "from scratch"
