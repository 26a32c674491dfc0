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
from slicekeeper.supervisor.leader.capacity import Replacement
from slicekeeper.supervisor.leader.generations import Generations
from slicekeeper.supervisor.leader.journal import FaultRecord, JobMemory
from slicekeeper.supervisor.leader.members import HostStatus, Members
from slicekeeper.supervisor.leader.remediation import Remediation
from slicekeeper.supervisor.leader.restart_machine import AllRegistered, JobState
from slicekeeper.supervisor.world import JobWorld

from slicekeeper.chaos import ChaosKind
from slicekeeper.policy.events import FaultKind


class Registrations:
    def __init__(
        self,
        *,
        memory: JobMemory,
        world: JobWorld,
        members: Members,
        status: dict[int, HostStatus],
        capacity: Replacement,
        generations: Generations,
        remediation: Remediation,
    ) -> None:
        self.memory = memory
        self.world = world
        self.members = members
        self.status = status
        self.capacity = capacity
        self.generations = generations
        self.remediation = remediation

    async def register(self, report: messages.Register, writer: asyncio.StreamWriter) -> None:
        if report.generation is not None and self.memory.state in (JobState.RUNNING, JobState.STOPPING):
            await self._rejoin(report, writer)
            return
        if report.restarted and self.memory.state in (JobState.RUNNING, JobState.STOPPING):
            await self._restarted(report, writer)
            return
        if self.memory.state is not JobState.REGISTERING:
            if self.memory.state is JobState.SUCCEEDED:
                await self.members.send_to(writer, messages.Shutdown())  # too late: the job is over
                return
            if self.memory.state is JobState.FAILED:
                await self.members.send_to(
                    writer, messages.Failed(reason=self.memory.failure_reason or "the job failed")
                )
                return
            if await self.capacity.joined(report, writer):
                await self.remediation.rejoined(report.host)
                return
        status = self.status[report.host]
        self.members.serve(report.host, writer)
        status.metrics_port = report.metrics_port
        status.replica_address = report.replica_address
        status.machine = report.machine or f"host-{report.host}"
        status.state = "registered"
        await self.members.event(
            f"host {report.host} registered", host=report.host, metrics_port=status.metrics_port
        )
        if len(self.members.writers) == self.world.full_hosts and self.memory.state is JobState.REGISTERING:
            await self.generations.send(AllRegistered())
        elif self.memory.state is not JobState.REGISTERING:
            await self.remediation.rejoined(report.host)  # its supervisor restarted: no workload runs

    async def _rejoin(self, report: messages.Register, writer: asyncio.StreamWriter) -> None:
        """A member of this job rejoins after its leader was lost, its workload still in `generation`."""
        host, generation = report.host, report.generation
        serving = self.members.writers.get(host)
        if serving is not None and serving is not writer:
            if self.status[host].machine != (report.machine or f"host-{host}"):
                reason = f"host {host} was taken over while its supervisor was away"
                retire = messages.Retire(generation=self.memory.generation, reason=reason)
                await self.members.send_to(writer, retire)
                return
            serving.close()  # the same member again (it followed a newer term): its older connection
        self.memory.high_water = max(self.memory.high_water, report.step or 0)
        lost = self.status[host].state == "lost"
        status = self.status[host]
        self.members.serve(host, writer)
        status.metrics_port, status.replica_address = report.metrics_port, report.replica_address
        status.machine = report.machine or f"host-{host}"
        status.state = "training" if self.memory.state is JobState.RUNNING else "stopping"
        await self.members.event(f"host {host} rejoined from {status.machine}", host=host)
        await self.capacity.returned(host)
        if not self.world.takes_part(host):
            # Its slice was dropped: it waits as an idle host. Dropped while it was away, its workload
            # stops, and the policy may scale back up with it; idle already (a leader lost while the
            # job ran scaled down), no capacity came back.
            await self.members.send(
                host, messages.Stop(generation=generation or 0, kind=FaultKind.SCALE_DOWN)
            )
            await self.members.send(host, messages.Park(generation=self.memory.generation))
            status.state = "parked"
            if not report.parked:
                await self.remediation.rejoined(host)
            elif self.memory.state is JobState.STOPPING:
                await self.generations.send(self.generations.reconsider())
        elif self.memory.state is JobState.STOPPING:
            kind = FaultKind((self.memory.stop_cause or {}).get("kind", FaultKind.HOST_LOST))
            await self.members.send(host, messages.Stop(generation=self.memory.generation, kind=kind))
        elif lost or generation != self.memory.generation:
            detail = (
                f"host {host} rejoined in generation {generation} while the job runs {self.memory.generation}"
            )
            await self.generations.send(
                self.generations.fault_stop(host, FaultKind.HOST_LOST, detail, time.time())
            )

    async def _restarted(self, report: messages.Register, writer: asyncio.StreamWriter) -> None:
        """A host's supervisor started again on its machine: its workload died with the one before.
        Unless another machine took the host over meanwhile, it serves on, and the generation it
        missed is stopped as a crash (its disk, local checkpoints included, is intact)."""
        host, machine = report.host, report.machine or f"host-{report.host}"
        serving = self.members.writers.get(host)
        if serving is not None and serving is not writer and self.status[host].machine != machine:
            reason = f"host {host} was taken over while the supervisor of {machine} restarted"
            retire = messages.Retire(generation=self.memory.generation, reason=reason)
            await self.members.send_to(writer, retire)
            return
        if serving is not None and serving is not writer:
            serving.close()  # the connection of the supervisor that died, not closed yet
        status = self.status[host]
        idle = status.state == "parked"
        self.members.serve(host, writer)
        status.metrics_port, status.replica_address = report.metrics_port, report.replica_address
        status.machine = machine
        await self.members.event(f"host {host}'s supervisor restarted on {machine}", host=host)
        await self.capacity.returned(host)
        if not self.world.takes_part(host):
            await self.members.send(host, messages.Park(generation=self.memory.generation))
            status.state = "parked"
            if not idle:  # else it idled before its supervisor died: no capacity came back
                await self.remediation.rejoined(host)
            elif self.memory.state is JobState.STOPPING:
                await self.generations.send(self.generations.reconsider())
        elif self.memory.state is JobState.STOPPING:
            status.state = "stopping"
            kind = FaultKind((self.memory.stop_cause or {}).get("kind", FaultKind.CRASH))
            await self.members.send(host, messages.Stop(generation=self.memory.generation, kind=kind))
        else:
            status.state = "stopping"
            await self.remediation.supervisor_restarted(host, machine)

    async def spare(self, spare: messages.RegisterSpare, writer: asyncio.StreamWriter) -> None:
        if not await self.capacity.offer(spare, writer):
            await self.members.event(f"spare {spare.spare} ignored: in a cluster new pods replace hosts")
            return
        if spare.chaos:
            machine = spare.machine or f"spare-{spare.spare}"
            self.memory.faults.append(
                FaultRecord(
                    ChaosKind.SPARE,
                    -1,
                    self.memory.high_water,
                    time.time(),
                    self.memory.generation,
                    spec=spare.chaos,
                    disruptive=False,
                    detail=f"{machine} joined",
                )
            )
        if len(self.members.live()) == self.world.full_hosts:
            await self.generations.send(AllRegistered())  # it stood in for a host lost before the start
        if self.world.scaled_down:
            await self.remediation.capacity_returned()
