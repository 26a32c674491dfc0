"""What the members say, each report to the part whose job it is.

Every line a member sends its leader is one `messages.ToLeader`; `Dispatch.handle` hands each to the
part that acts on it: registrations (who joins), the restart machine's driver (stop acks, hosts
finished), remediation (faults, activities, stragglers), announced losses (notices, replicas), the
checkpoint records, the hosts' table. A step reported is recorded once (the job's progress, a
straggler check, the journal when it is productive), and a chaos fault fired is written down so that
it never fires again, whoever leads. The leader's server (leader.leader) reads the lines; a leader
taking over replays the reports it gathered through the same dispatch (leader.takeover).
"""

from __future__ import annotations

import asyncio

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader import restart_events
from slicekeeper.supervisor.leader import status as views
from slicekeeper.supervisor.leader.admission import HostState
from slicekeeper.supervisor.leader.announced import AnnouncedLosses
from slicekeeper.supervisor.leader.context import LeaderContext
from slicekeeper.supervisor.leader.generations import Generations
from slicekeeper.supervisor.leader.journal import FaultRecord
from slicekeeper.supervisor.leader.members import send
from slicekeeper.supervisor.leader.registrations import Registrations
from slicekeeper.supervisor.leader.remediation import Remediation


class Dispatch:
    def __init__(
        self,
        context: LeaderContext,
        *,
        generations: Generations,
        remediation: Remediation,
    ) -> None:
        """The parts that only the members' reports reach (registrations, announced losses) are
        made here; the restart machine's driver and remediation are shared with the leader."""
        self.context = context
        self.generations = generations
        self.remediation = remediation
        self.announced = AnnouncedLosses(context, generations=generations, remediation=remediation)
        self.registrations = Registrations(context, generations=generations, remediation=remediation)

    async def handle(self, message: messages.ToLeader, writer: asyncio.StreamWriter) -> None:
        match message:
            case messages.Watch():
                self.context.members.watchers.append(writer)
                await send(writer, views.status_line(self.context.memory, self.context.status))
            case messages.RegisterSpare():
                await self.registrations.spare(message, writer)
            case messages.Register():
                await self.registrations.register(message, writer)
            case messages.StateReport(host=host, state=state):
                self.context.status[host].state = HostState(state)
            case messages.Progress():
                await self._progress(message)
            case messages.Committed(host=host, step=step):
                self.context.status[host].committed.add(step)
            case messages.CheckpointInvalid():
                await self.context.checkpoints.invalid(message)
            case messages.Persisted(host=host, step=step):
                await self.context.checkpoints.persisted(host, step)
            case messages.Restored():
                self.context.checkpoints.restored(message)
            case messages.Loaded():
                self.context.checkpoints.loaded(message)
            case messages.ChaosFired():
                await self._chaos(message)
            case messages.Fault():
                await self.remediation.fault(message)
            case messages.Notice():
                await self.announced.notice(message)
            case messages.Replicated():
                self.announced.replicated(message)
            case messages.ActivityReport():
                self.remediation.activity(message)
            case messages.Stopped():
                await self.generations.acked(message)
            case messages.Finished():
                await self.generations.finished_on(message)

    async def _progress(self, report: messages.Progress) -> None:
        if not self.context.memory.restart.runs(report.generation):
            return  # a step of a generation being torn down will be executed again
        status = self.context.status[report.host]
        status.step, status.loss, status.state = report.step, report.loss, HostState.TRAINING
        status.steps_seen.append((report.t, report.step))
        del status.steps_seen[:-50]
        if not self.generations.progressed:
            await self.generations.send(restart_events.Progressed())
        productive = False
        for step, t, work in (*report.earlier, (report.step, report.t, report.work)):
            await self.remediation.straggler_check(report.host, step, work, t, core=report.core)
            productive = self.context.memory.progressed(step, t) or productive
        if productive:
            await self.context.journal.write()

    async def _chaos(self, fired: messages.ChaosFired) -> None:
        record = FaultRecord(
            fired.kind,
            fired.host,
            fired.step,
            fired.t,
            fired.generation,
            spec=fired.fault,
            disruptive=fired.disruptive,
            detail=fired.detail,
        )
        self.context.memory.faults.append(record)
        await self.context.members.event(
            f"chaos: {fired.kind} host {fired.host} at step {fired.step}", host=fired.host
        )
        await self.context.journal.write()  # a fault fired never fires again, whoever leads
