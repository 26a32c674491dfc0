"""Who joins the job's leader, and what becomes of them: hosts, spares, and members coming back.

A host's supervisor registers before the job starts (the start waits for every host), or after: a
replacement pod (the capacity's business), a member rejoining a new leader after its leader was lost
(with the generation its workload is in), or a supervisor started again on its machine after its
process died (its workload died with it). A spare offers itself to the capacity. Each is told what
to do: nothing yet, to stop with the rest, to park, or to retire when another machine took its host
over meanwhile.
"""

from __future__ import annotations

import asyncio
import time

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader.admission import (
    UNKNOWN_CAUSE,
    Admission,
    Answer,
    Back,
    HostState,
    Joining,
    Step,
)
from slicekeeper.supervisor.leader.context import LeaderContext
from slicekeeper.supervisor.leader.generations import Generations
from slicekeeper.supervisor.leader.journal import FaultRecord
from slicekeeper.supervisor.leader.remediation import Remediation
from slicekeeper.supervisor.leader.restart_events import (
    Admit,
    AllRegistered,
    Joins,
    NoWorkload,
    Registered,
    Request,
    Returns,
    ServeAgain,
)

from slicekeeper.chaos import ChaosKind
from slicekeeper.policy.events import FaultKind


class Registrations:
    def __init__(self, context: LeaderContext, *, generations: Generations, remediation: Remediation) -> None:
        self.context = context
        self.generations = generations
        self.remediation = remediation

    async def register(self, report: messages.Register, writer: asyncio.StreamWriter) -> None:
        memory = self.context.memory
        joining = (
            Joining.REJOINING
            if report.generation is not None
            else Joining.RESTARTED
            if report.restarted
            else Joining.HOST
        )
        [admitted] = await self.generations.ask(Joins(joining))
        assert isinstance(admitted, Admit)
        match admitted.admission:
            case Admission.REJOIN:
                await self._rejoin(report, writer)
                return
            case Admission.RESTARTED:
                await self._restarted(report, writer)
                return
            case Admission.TOO_LATE:
                await self.context.members.send_to(writer, messages.Shutdown())
                return
            case Admission.REFUSED:
                reason = memory.failure_reason or "the job failed"
                await self.context.members.send_to(writer, messages.Failed(reason=reason))
                return
            case Admission.LATE if await self.context.capacity.joined(report, writer):
                await self._back(report.host, Back(Joining.HOST, self.context.world.takes_part(report.host)))
                return
        status = self.context.status[report.host]
        self.context.members.serve(report.host, writer)
        status.metrics_port = report.metrics_port
        status.replica_address = report.replica_address
        status.machine = report.machine or f"host-{report.host}"
        status.state = HostState.REGISTERED
        await self.context.members.event(
            f"host {report.host} registered", host=report.host, metrics_port=status.metrics_port
        )
        # Before the start: maybe the last the start waits for; after it, a machine serving its host
        # again with no workload (its supervisor restarted).
        facts = Back(Joining.HOST, self.context.world.takes_part(report.host))
        registered = Registered(len(self.context.members.writers), self.context.world.full_hosts, facts)
        await self._carry_out(report.host, facts, await self.generations.ask(registered))

    async def _rejoin(self, report: messages.Register, writer: asyncio.StreamWriter) -> None:
        """A member of this job rejoins after its leader was lost, its workload still in `generation`."""
        host, generation = report.host, report.generation
        serving = self.context.members.writers.get(host)
        if serving is not None and serving is not writer:
            if self.context.status[host].machine != (report.machine or f"host-{host}"):
                reason = f"host {host} was taken over while its supervisor was away"
                retire = messages.Retire(generation=self.context.memory.generation, reason=reason)
                await self.context.members.send_to(writer, retire)
                return
            serving.close()  # the same member again (it followed a newer term): its older connection
        self.context.memory.high_water = max(self.context.memory.high_water, report.step or 0)
        lost = self.context.status[host].state == HostState.LOST
        status = self.context.status[host]
        self.context.members.serve(host, writer)
        status.metrics_port, status.replica_address = report.metrics_port, report.replica_address
        status.machine = report.machine or f"host-{host}"
        await self.context.members.event(f"host {host} rejoined from {status.machine}", host=host)
        await self.context.capacity.returned(host)
        # Its slice dropped while it was away, its workload stops and the policy may scale back up with
        # it; idle already (a leader lost while the job ran scaled down), no capacity came back.
        facts = Back(
            Joining.REJOINING,
            self.context.world.takes_part(host),
            idle=report.parked,
            in_step=not lost and generation == self.context.memory.generation,
        )
        await self._back(host, facts, generation=generation)

    async def _restarted(self, report: messages.Register, writer: asyncio.StreamWriter) -> None:
        """A host's supervisor started again on its machine: its workload died with the one before.
        Unless another machine took the host over meanwhile, it serves on, and the generation it
        missed is stopped as a crash (its disk, local checkpoints included, is intact)."""
        host, machine = report.host, report.machine or f"host-{report.host}"
        serving = self.context.members.writers.get(host)
        if serving is not None and serving is not writer and self.context.status[host].machine != machine:
            reason = f"host {host} was taken over while the supervisor of {machine} restarted"
            retire = messages.Retire(generation=self.context.memory.generation, reason=reason)
            await self.context.members.send_to(writer, retire)
            return
        if serving is not None and serving is not writer:
            serving.close()  # the connection of the supervisor that died, not closed yet
        status = self.context.status[host]
        idle = status.state == HostState.PARKED  # it idled before its supervisor died
        self.context.members.serve(host, writer)
        status.metrics_port, status.replica_address = report.metrics_port, report.replica_address
        status.machine = machine
        await self.context.members.event(f"host {host}'s supervisor restarted on {machine}", host=host)
        await self.context.capacity.returned(host)
        await self._back(host, Back(Joining.RESTARTED, self.context.world.takes_part(host), idle=idle))

    async def _back(self, host: int, facts: Back, generation: int | None = None) -> None:
        """Carry out what the machine (leader.admission.back) says of a host served again after the
        start (`generation`: the one its workload is in, rejoining)."""
        await self._carry_out(host, facts, await self.generations.ask(Returns(facts)), generation)

    async def _carry_out(
        self, host: int, facts: Back, requests: tuple[Request, ...], generation: int | None = None
    ) -> None:
        for request in requests:
            if isinstance(request, ServeAgain):
                await self._serve_again(host, facts, request.answer, generation)

    async def _serve_again(self, host: int, facts: Back, answer: Answer, generation: int | None) -> None:
        memory = self.context.memory
        if answer.state is not None:
            self.context.status[host].state = answer.state
        for step in answer.steps:
            match step:
                case Step.STOP_AS_DROPPED:
                    stop = messages.Stop(generation=generation or 0, kind=FaultKind.SCALE_DOWN)
                    await self.context.members.send(host, stop)
                case Step.PARK:
                    await self.context.members.send(host, messages.Park(generation=memory.generation))
                case Step.CAPACITY_RETURNED:
                    await self.remediation.capacity_returned()
                case Step.RECONSIDER:
                    await self.generations.send(self.generations.reconsider())
                case Step.STOP_WITH_THE_REST:
                    kind = FaultKind((memory.stop_cause or {}).get("kind", UNKNOWN_CAUSE[facts.joining]))
                    stop = messages.Stop(generation=memory.generation, kind=kind)
                    await self.context.members.send(host, stop)
                case Step.STOP_AS_LOST:
                    detail = (
                        f"host {host} re-registered while running"
                        if facts.joining is Joining.HOST
                        else f"host {host} rejoined in generation {generation} while the job runs "
                        f"{memory.generation}"
                    )
                    await self.generations.send(
                        self.generations.fault_stop(host, FaultKind.HOST_LOST, detail, time.time())
                    )
                case Step.NO_WORKLOAD:
                    await self.generations.send(NoWorkload(host))
                case Step.CRASH:
                    await self.remediation.supervisor_restarted(host, self.context.status[host].machine)

    async def spare(self, spare: messages.RegisterSpare, writer: asyncio.StreamWriter) -> None:
        if not await self.context.capacity.offer(spare, writer):
            await self.context.members.event(
                f"spare {spare.spare} ignored: in a cluster new pods replace hosts"
            )
            return
        if spare.chaos:
            machine = spare.machine or f"spare-{spare.spare}"
            self.context.memory.faults.append(
                FaultRecord(
                    ChaosKind.SPARE,
                    -1,
                    self.context.memory.high_water,
                    time.time(),
                    self.context.memory.generation,
                    spec=spare.chaos,
                    disruptive=False,
                    detail=f"{machine} joined",
                )
            )
        if len(self.context.members.live()) == self.context.world.full_hosts:
            await self.generations.send(AllRegistered())  # it stood in for a host lost before the start
        if self.context.world.scaled_down:
            await self.remediation.capacity_returned()
