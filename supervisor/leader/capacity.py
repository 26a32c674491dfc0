"""Where a new machine for a host comes from: one interface, a spare pool locally, new pods in a cluster.

When the policy replaces a host (`ReplaceHost`), or a slice comes back (`ScaleUp`), some machine must
take the host's identity and restore its shard. Locally (`slicekeeper run`) idle spare supervisors wait
for that (`SparePool`): the leader assigns one the host and it joins the next generation. In a cluster
(`PodReplacements`) the host's pod goes (a live one retires and marks its pod), the operator creates a
new pod with the same identity, and the job stays stopped until that pod's supervisor registers or
spec.health.replacementTimeoutSeconds passes (then the policy decides again, with no spare).

The leader and its policy see only `Replacement`: how many machines they may count on, and
"replace this host".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader.admission import HostState
from slicekeeper.supervisor.leader.background import BackgroundWork, Task
from slicekeeper.supervisor.leader.journal import JobMemory, JournalWriter
from slicekeeper.supervisor.leader.members import HostStatus, Members
from slicekeeper.supervisor.leader.restart_events import NoWorkload
from slicekeeper.supervisor.leader.restart_inbox import RestartInbox


class Replacement(Protocol):
    def for_policy(self) -> int:
        """Machines the policy may count on to replace a host."""

    def for_scale_up(self) -> int:
        """Machines that can stand in for hosts of a dropped slice with no machine left."""

    def awaiting(self) -> list[int]:
        """Hosts whose new machine is on its way (the job waits for them)."""

    async def replace(self, host: int, reason: str) -> str | None:
        """Give `host` a new machine (a live one retires first); why it cannot be done, or None."""

    async def stand_in(self, host: int, scale_up: bool = False) -> str | None:
        """A host with no machine before the job started, or (`scale_up`) of a slice coming back."""

    async def offer(self, spare: messages.RegisterSpare, writer: asyncio.StreamWriter) -> bool:
        """A spare supervisor registered; False when this kind of capacity has no use for it."""

    async def joined(self, report: messages.Register, writer: asyncio.StreamWriter) -> bool:
        """A host's supervisor registered after the job started; False when that is not a replacement."""

    async def returned(self, host: int) -> bool:
        """`host`'s own supervisor came back (it rejoined a new leader) while a new machine for it was
        awaited: none is needed now. False when none was awaited."""

    def lost(self, writer: asyncio.StreamWriter) -> list[str]:
        """A connection dropped: the idle spares it served (their machines), now gone."""

    async def release(self) -> None:
        """The job ended: idle spares end too."""


@dataclass(frozen=True)
class LeaderParts:
    """What of the leader a `Replacement` is built from."""

    members: Members
    status: dict[int, HostStatus]
    memory: JobMemory
    journal: JournalWriter
    """Writes the job's memory down (before a spare is told its host)."""
    background: BackgroundWork
    inbox: RestartInbox
    """The restart machine's: a new machine serving a host has no workload to stop; a host lost before
    the start with no spare fails the job; a pod that never came is decided on again."""


Replacements = Callable[[LeaderParts], "Replacement"]
"""Builds the leader's `Replacement` from its parts: the site's choice (a spare pool locally, new
pods in a cluster: supervisor.host.site), made once."""


def spare_pool(parts: LeaderParts) -> Replacement:
    """Idle spare supervisors take over lost hosts (`slicekeeper run`); none is declared to come."""
    return SparePool(parts, declared=0, wait=0.0)


def declared_spares(count: int, wait: float) -> Replacements:
    """Idle spare supervisors take over lost hosts; `count` are declared (spec.local.spares): a host
    lost before the job started waits up to `wait` seconds (spec.health.startupTimeoutSeconds) for
    one that has not registered yet."""
    return lambda parts: SparePool(parts, declared=count, wait=wait)


def pod_replacements(timeout: float) -> Replacements:
    """The operator replaces a lost host's pod, awaited up to `timeout` seconds (a cluster)."""

    def build(parts: LeaderParts) -> Replacement:
        return PodReplacements(parts, timeout=timeout)

    return build


@dataclass
class Spare:
    """A registered spare supervisor, idle until it takes over a lost host's identity."""

    spare: int
    writer: asyncio.StreamWriter
    machine: str
    replica_address: str | None
    metrics_port: int | None


class _Crew:
    """What both kinds share: the members, the leader's view of the hosts, the job's memory."""

    def __init__(self, parts: LeaderParts) -> None:
        self.members = parts.members
        self.status = parts.status
        self.memory = parts.memory
        self._parts = parts

    async def retire(self, host: int, reason: str) -> None:
        """A live machine leaves the job (replaced, e.g. a straggler): its supervisor ends."""
        writer = self.members.drop(host)
        await self.members.send_to(writer, messages.Retire(generation=self.memory.generation, reason=reason))
        await self.members.event(f"host {host} ({self.status[host].machine}) retired: {reason}", host=host)

    async def arrived(self, host: int, writer: asyncio.StreamWriter, status: HostStatus) -> None:
        """A new machine serves `host`: it has no workload to stop, and holds nothing yet. (The
        straggler detector starts afresh with the generation it joins: leader.generations.)"""
        self.status[host] = status
        self.members.serve(host, writer)
        # The machine's answer, not the phase before the event's turn: a stop queued meanwhile counts.
        answer = await self._parts.inbox.send(NoWorkload(host))
        if answer.stopping:  # it counts as having stopped its workload
            self.status[host].state = HostState.STOPPED


class SparePool(_Crew):
    """Locally: idle spare supervisors take over hosts."""

    def __init__(self, parts: LeaderParts, *, declared: int, wait: float) -> None:
        super().__init__(parts)
        self.spares: list[Spare] = []
        self._declared, self._wait = declared, wait
        self._offered = 0
        """Spares that registered so far: while fewer than declared, more are on their way."""
        self._wanting: dict[int, asyncio.TimerHandle] = {}
        """Hosts lost before the job started, each awaiting a declared spare (up to `wait`)."""

    def for_policy(self) -> int:
        return len(self.spares)

    def for_scale_up(self) -> int:
        return len(self.spares)

    def awaiting(self) -> list[int]:
        return sorted(self._wanting)

    async def offer(self, spare: messages.RegisterSpare, writer: asyncio.StreamWriter) -> bool:
        machine = spare.machine or f"spare-{spare.spare}"
        self.spares.append(Spare(spare.spare, writer, machine, spare.replica_address, spare.metrics_port))
        self._offered += 1
        await self.members.event(f"spare {spare.spare} ({machine}) registered")
        if self._wanting:  # a host lost before the start awaits it
            host = min(self._wanting)
            self._wanting.pop(host).cancel()
            await self.stand_in(host)
        return True

    def _on_its_way(self) -> bool:
        """A declared spare has not registered yet (before the start, one is awaited rather than the
        job failed: the spares' processes start after the hosts')."""
        return self._offered + len(self._wanting) < self._declared

    async def _no_spare(self, host: int) -> None:
        if self._wanting.pop(host, None) is None:
            return
        await self._parts.inbox.fail(
            f"host {host} was lost before the job started and none of the {self._declared} declared "
            f"spare(s) registered within {self._wait:g} s (spec.health.startupTimeoutSeconds)"
        )

    async def replace(self, host: int, reason: str) -> str | None:
        if not self.spares:
            return f"no spare left to replace host {host}"
        if host in self.members:
            await self.retire(host, reason)
        await self.stand_in(host)
        return None

    async def stand_in(self, host: int, scale_up: bool = False) -> str | None:
        """Give a spare `host`'s identity: a hot-swap, or (`scale_up`) a dropped slice coming back."""
        if not self.spares and not scale_up and self._on_its_way():
            self._wanting[host] = self._parts.background.later(
                self._wait, Task.REPLACEMENT, lambda: self._no_spare(host)
            )
            await self.members.event(
                f"host {host} lost before the job started: awaiting a declared spare "
                f"(up to {self._wait:g} s)",
                host=host,
            )
            return None
        if not self.spares:
            return f"host {host} was lost before the job started and no spare is left"
        spare = min(self.spares, key=lambda s: s.spare)  # deterministic: the lowest index first
        self.spares.remove(spare)
        status = HostStatus(
            state=HostState.STOPPED,
            metrics_port=spare.metrics_port,
            replica_address=spare.replica_address,
            machine=spare.machine,
        )
        await self.arrived(host, spare.writer, status)
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
        # Written down before the spare is told (write-ahead): a leader taking over mid-swap knows the
        # spare serves the host, and counts the swap.
        await self._parts.journal.write()
        await self.members.send_to(
            spare.writer, messages.Assign(host=host, generation=self.memory.generation, fired=fired)
        )
        what = "scale-up" if scale_up else "hot-swap"
        await self.members.event(
            f"{what}: spare {spare.spare} ({spare.machine}) takes over host {host}", host=host
        )
        return None

    async def joined(self, report: messages.Register, writer: asyncio.StreamWriter) -> bool:
        return False

    async def returned(self, host: int) -> bool:
        return False  # a spare takes a lost host over at once: nothing is awaited

    def lost(self, writer: asyncio.StreamWriter) -> list[str]:
        gone = [s for s in self.spares if s.writer is writer]
        for spare in gone:
            self.spares.remove(spare)
        return [f"spare {s.spare} ({s.machine})" for s in gone]

    async def release(self) -> None:
        for timer in self._wanting.values():
            timer.cancel()
        self._wanting.clear()
        for spare in self.spares:
            await self.members.send_to(spare.writer, messages.Shutdown())


class PodReplacements(_Crew):
    """In a cluster: the operator replaces a host's pod by a new one with its identity."""

    def __init__(self, parts: LeaderParts, *, timeout: float) -> None:
        super().__init__(parts)
        self.timeout = timeout
        """How long a replacement pod is awaited (spec.health.replacementTimeoutSeconds)."""
        self._awaited: dict[int, asyncio.TimerHandle] = {}
        self._no_capacity = False
        """A replacement did not join in time; the policy sees no spare until one joins."""

    def for_policy(self) -> int:
        """The operator replaces any host (one at a time is enough to say so) until a replacement
        failed to join."""
        return 0 if self._no_capacity else 1

    def for_scale_up(self) -> int:
        return 0  # a dropped slice comes back with its own pods re-registering

    def awaiting(self) -> list[int]:
        return sorted(self._awaited)

    async def offer(self, spare: messages.RegisterSpare, writer: asyncio.StreamWriter) -> bool:
        return False

    async def stand_in(self, host: int, scale_up: bool = False) -> str | None:
        return None  # the operator re-creates the pod, which registers as any other

    async def replace(self, host: int, reason: str) -> str | None:
        """The host's pod goes (a live one retires: its supervisor marks its pod for replacement and
        ends); the job stays stopped until the new pod's supervisor registers, or the timeout."""
        if host in self.members:
            await self.retire(host, reason)
        self.status[host] = HostStatus(state=HostState.AWAITING_REPLACEMENT)
        if host in self._awaited:
            return None
        self._awaited[host] = self._parts.background.later(
            self.timeout, Task.REPLACEMENT, lambda: self._no_replacement(host)
        )
        await self.members.event(
            f"awaiting a replacement pod for host {host} (up to {self.timeout:g} s)", host=host
        )
        return None

    async def _no_replacement(self, host: int) -> None:
        if self._awaited.pop(host, None) is None:
            return
        self._no_capacity = True
        await self.members.event(
            f"no replacement for host {host} joined within {self.timeout:g} s "
            "(spec.health.replacementTimeoutSeconds): no capacity",
            host=host,
        )
        await self._parts.inbox.no_replacement(host)  # the policy decides again, with no spare

    async def joined(self, report: messages.Register, writer: asyncio.StreamWriter) -> bool:
        """A pod with the host's identity registered after the job started: the operator's replacement
        (or the same host's pod again)."""
        host = report.host
        machine = report.machine or f"host-{host}"
        old = self.members.writers.get(host)
        if old is not None and old is not writer:
            # The pod this one replaces may live on (its node cut off from the API server, which
            # deleted it): told to retire, its supervisor stops its workload and ends, before the
            # new pod's workload starts. (Its request for a replacement then names the uid of a pod
            # that is gone, and is refused: supervisor/pod/own_pod.py.)
            reason = f"host {host} was taken over by a new pod on {machine}"
            await self.members.send_to(old, messages.Retire(generation=self.memory.generation, reason=reason))
            old.close()
        status = HostStatus(
            state=HostState.REGISTERED,
            metrics_port=report.metrics_port,
            replica_address=report.replica_address,
            machine=machine,
        )
        await self.arrived(host, writer, status)
        self._no_capacity = False
        handle = self._awaited.pop(host, None)
        if handle is not None:
            handle.cancel()
            self.memory.hot_swaps.append(
                {"host": host, "spare": None, "machine": machine, "generation": self.memory.generation}
            )
            await self.members.event(f"hot-swap: a new pod on {machine} takes over host {host}", host=host)
        else:
            await self.members.event(f"host {host} re-registered from {machine}", host=host)
        return True

    async def returned(self, host: int) -> bool:
        """The operator replaces only a pod that failed, went or was marked: a pod whose supervisor
        was only out of reach (a leader's pod paused long enough to be replaced as leader) lives on,
        and no new pod would come for its host."""
        handle = self._awaited.pop(host, None)
        if handle is None:
            return False
        handle.cancel()
        await self.members.event(f"host {host} came back: its replacement is no longer awaited", host=host)
        return True

    def lost(self, writer: asyncio.StreamWriter) -> list[str]:
        return []

    async def release(self) -> None:
        for handle in self._awaited.values():
            handle.cancel()
