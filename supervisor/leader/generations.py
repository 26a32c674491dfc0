"""The restart state machine: every host of a job restarts together, in a generation all agree on.

    RUNNING(g) --fault--> STOPPING(g): every member kills its workload and acks `stopped`
    STOPPING(g) --all acked, no decision pending--> RUNNING(g+1): `start` with a fresh coordinator
                                address, the newest step every host can restore, each host's sources
    any state --a limit reached (leader.restart_rule)--> FAILED: `fail` with the reason
    RUNNING(g) --all finished--> SUCCEEDED: `shutdown`

Hosts of a dropped slice get `park` instead of `start`. What changes who takes part (a replacement,
a scale-down or up) is decided and applied while the job is stopped (leader.remediation); the start
waits for it (`holds`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader.capacity import Replacement
from slicekeeper.supervisor.leader.checkpoints import Checkpoints
from slicekeeper.supervisor.leader.decisions import Decisions
from slicekeeper.supervisor.leader.journal import Detection, JobMemory, JobState, JournalWriter
from slicekeeper.supervisor.leader.members import HostStatus, Members
from slicekeeper.supervisor.leader.restart_rule import RestartRule
from slicekeeper.supervisor.world import JobWorld

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
        coordinator_address: Callable[[int, int], str],
        ended: Callable[[], None],
    ) -> None:
        self.memory = memory
        self.world = world
        self.members = members
        self.status = status
        self.checkpoints = checkpoints
        self.journal = journal
        self.capacity = capacity
        self.rule = rule
        self.decisions = decisions
        self._coordinator_address = coordinator_address
        self._ended = ended
        """The job succeeded or failed: write the summary."""
        self.done = asyncio.Event()
        self.holds: Callable[[], bool] = lambda: False
        """A decision is under way or a `Wait` holds the job stopped: no start yet."""
        self.stopped: set[int] = set()
        """Members that acked the stop of this generation."""
        self.finished: dict[int, messages.Finished] = {}
        self.progressed = False
        """The running generation completed a step."""
        self._ack_deadline: asyncio.TimerHandle | None = None
        self._overdue: asyncio.Future[None] | None = None
        self._first_start_under_way = False

    @property
    def over(self) -> bool:
        return self.memory.state in (JobState.SUCCEEDED, JobState.FAILED)

    async def stop(self, host: int, kind: str, detail: str, now: float, planned: bool = False) -> bool:
        """Turn a fault of the running generation into a stop of every host; False if the job failed.

        `planned`: a stop the policy chose with nothing broken (a scale-up): no restart limit applies."""
        generation = self.memory.generation
        # Decide before the first await: a concurrent report of the same stall must see STOPPING.
        self.rule.stop(self.memory, self.progressed, planned)
        reason = None if planned else self.rule.refusal(self.memory, f"{kind} on host {host} ({detail})")
        if reason is None:
            self.memory.restarts[kind] += 1
            self.memory.state = JobState.STOPPING
            self.stopped.clear()
            self.memory.stop_cause = {
                "kind": kind,
                "host": host,
                "t": now,
                "high_water": self.memory.high_water,
                "planned": planned,
            }
        for record in self.memory.faults if not planned else []:
            if record.detected_at is None and record.generation == generation and record.disruptive:
                record.detected_at, record.detected_as = now, kind
                record.high_water_at_detection = self.memory.high_water
                record.detected_in_generation = generation
        if planned:
            await self.members.event(f"stopping every host: {detail} ({kind})", kind=kind)
        else:
            self.memory.detections.append(Detection(kind, host, generation, now, detail))
            await self.members.event(f"{kind} detected on host {host}: {detail}", host=host, kind=kind)
        if reason is not None:
            await self.fail(reason)
            return False
        await self.journal.write()
        stop = messages.Stop(generation=generation, kind=kind, host=None if planned else host)
        for member in self.world.hosts:
            if member in self.members:
                await self.members.send(member, stop)
        self._ack_deadline = asyncio.get_running_loop().call_later(
            STOP_ACK_SECONDS, self._acks_overdue, generation
        )
        return True

    async def acked(self, report: messages.Stopped) -> None:
        if report.generation != self.memory.generation or self.memory.state is not JobState.STOPPING:
            return
        self.checkpoints.stopped(report)
        self.stopped.add(report.host)
        self.status[report.host].state = "stopped"
        await self.start_when_all_stopped()

    async def finished_on(self, report: messages.Finished) -> None:
        if report.generation != self.memory.generation or self.memory.state is not JobState.RUNNING:
            return
        self.finished[report.host] = report
        self.status[report.host].state = "finished"
        if set(self.world.hosts) <= self.finished.keys():
            await self.succeed()

    def _acks_overdue(self, generation: int) -> None:
        if self.memory.state is JobState.STOPPING and self.memory.generation == generation:
            missing = sorted(set(self.world.hosts) & self.members.live() - self.stopped)
            if not missing:
                return  # all stopped; the start waits for a decision (a policy's Wait), not for acks
            reason = f"host(s) {missing} did not stop their workload within {STOP_ACK_SECONDS:.0f} s"
            self._overdue = asyncio.ensure_future(self.fail(reason))

    async def start_when_all_stopped(self) -> None:
        """Start once every live active member acked its stop and no decision is still being taken."""
        if self.memory.state is not JobState.STOPPING or self.holds():
            return
        live = {h for h in self.world.hosts if h in self.members}
        if live <= self.stopped:
            await self.start()

    async def start(self) -> None:
        if self._ack_deadline is not None:
            self._ack_deadline.cancel()
        first = self.memory.state is JobState.REGISTERING
        if first:
            if self._first_start_under_way:
                return  # a second call while the first one reads the persistent tier
            self._first_start_under_way = True
            unreadable = await self.checkpoints.find_persistent()
            self._first_start_under_way = False
            if unreadable is not None:
                await self.fail(unreadable)
                return
            if self.memory.state is not JobState.REGISTERING:
                return
        missing = [h for h in self.world.hosts if h not in self.members]
        if missing:
            if first:
                return  # a host was lost while the tier was read: the next registration starts the job
            await self.fail(
                f"host(s) {missing} have no machine, and the policy decided neither a replacement nor a "
                "scale-down for them"
            )
            return
        plan = self.checkpoints.restore_plan()
        held = self.checkpoints.held()
        if not first:
            self.memory.generation += 1
        restore_step = plan.step
        if not first or restore_step is not None:
            self._record_recovery(restore_step, held, resumed=first)
        if first and restore_step is not None:
            self.memory.high_water = restore_step  # the steps an earlier run completed
        self.checkpoints.abandon_after(restore_step)
        if self.memory.detections:
            self.memory.detections[-1].restore_step = restore_step
        self.memory.state = JobState.RUNNING
        self.progressed = False
        self.finished.clear()
        self.world.record(self.memory.high_water, self.memory.generation)
        self.decisions.new_world()
        await self.journal.write()
        generation, world = self.memory.generation, self.world.hosts
        address = self._coordinator_address(generation, world[0])
        addresses = {h: s.replica_address for h, s in self.status.items() if s.replica_address}
        for host in sorted(self.members.live()):
            if host not in world:
                self.status[host].state = "parked"
                await self.members.send(host, messages.Park(generation=generation, restore_step=restore_step))
                continue
            self.status[host].state = "starting"
            start = messages.Start(
                generation=generation,
                coordinator=address,
                restore_step=restore_step,
                sources=[src.to_message(addresses) for src in plan.sources.get(host, ())],
                replica_addresses=addresses,
                world=world,
                rank=world.index(host),
            )
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
                "world": list(self.world.hosts),
                "held": held,
            }
        )

    async def succeed(self) -> None:
        self.memory.state = JobState.SUCCEEDED
        self._ended()
        await self.members.event("training finished on every host")
        await self.journal.write()
        await self.members.broadcast(messages.Shutdown())
        await self.capacity.release()
        self.done.set()

    async def fail(self, reason: str) -> None:
        if self.over:
            return
        self.memory.state = JobState.FAILED
        self.memory.failure_reason = reason
        self._ended()
        await self.members.event(f"job failed: {reason}")
        await self.journal.write()
        await self.members.broadcast(messages.Failed(reason=reason))
        await self.capacity.release()
        self.done.set()


def _where(first: bool, restore_step: int | None) -> str:
    if restore_step is None and not first:
        return "from scratch: no checkpoint step is complete across the hosts"
    if first and restore_step is not None:
        return f"from step {restore_step} of an earlier run (persistent tier)"
    return f"from step {restore_step}" if restore_step is not None else "from scratch"
