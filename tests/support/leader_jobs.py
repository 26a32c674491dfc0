"""A real Leader with fake members, fake spares and a watcher of its events, over TCP on 127.0.0.1.

For the leader's tests of spares and hot-swap, of restore sources over the tiers, and of supervisors
started again on their machines (tests/unit): `running_job` (no spares) and `job_with_spares` give a
running job, `restart` and `killed_after_five_steps` take it through a fault, `lose` loses a host,
`all_stop` and `assigned` check what the leader commands, `FakePersistent` stands in for the
persistent tier.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from slicekeeper.supervisor.leader import Leader
from slicekeeper.supervisor.leader.capacity import Replacements, spare_pool
from slicekeeper.supervisor.leader.settings import LeaderSettings

from slicekeeper.shape import JobShape
from tests.support.fake_members import Member, coordinator, eventually, join


def replica_address(host: int) -> str:
    return f"10.0.1.{host}:7100"


def spare_address(spare: int) -> str:
    return f"10.0.2.{spare}:7100"


def local() -> dict[str, Any]:
    return {"tier": "local"}


def persistent() -> dict[str, Any]:
    return {"tier": "persistent"}


def peer(holder: int, address: str | None = None) -> dict[str, Any]:
    return {"tier": "peer", "holder": holder, "address": address or replica_address(holder)}


class FakePersistent:
    """Stands in for the persistent tier: records the leader's commit and retain calls; `earlier`
    is what earlier runs committed (step -> hosts whose shard it holds); `unreadable` makes listing it
    fail."""

    def __init__(
        self,
        error: Exception | None = None,
        earlier: dict[int, set[int]] | None = None,
        unreadable: Exception | None = None,
    ) -> None:
        self.calls: list[tuple[str, int]] = []
        self.error = error
        self.earlier = earlier or {}
        self.unreadable = unreadable
        self.listings = 0
        self.call_timeout, self.attempts = 5.0, 3  # as PersistentTier: the leader's limits on its calls

    def committed_owners(self) -> dict[int, set[int]]:
        self.listings += 1
        if self.unreadable is not None:
            raise self.unreadable
        return dict(self.earlier)

    def commit(self, step: int) -> None:
        self.calls.append(("commit", step))
        if self.error is not None:
            raise self.error

    def retain(self, keep: int) -> None:
        self.calls.append(("retain", keep))


@dataclass
class Job:
    leader: Leader
    members: list[Member]
    spares: list[Member]
    watcher: Member
    events: list[str] = field(default_factory=list)
    port: int = 0
    """The leader's: where a spare registering later connects."""

    async def event(self, fragment: str) -> str:
        """The first event (seen so far or next) whose text contains `fragment`."""
        while True:
            for text in self.events:
                if fragment in text:
                    return text
            message = await self.watcher.receive()
            if message["type"] == "event":
                self.events.append(message["text"])

    async def shut(self) -> None:
        for connection in [*self.members, *self.spares, self.watcher]:
            connection.close()
        await self.leader.close()


async def spare_registers(port: int, spare: int) -> Member:
    """A fake spare supervisor: host None until the leader assigns it one."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    member = Member(None, reader, writer)  # type: ignore[arg-type]
    await member.send(
        "register_spare",
        spare=spare,
        machine=f"spare-{spare}",
        replica_address=spare_address(spare),
        metrics_port=9200 + spare,
    )
    return member


async def leader_with_spares(
    hosts: int = 3,
    spares: int = 1,
    max_restarts: int = 3,
    persistent: FakePersistent | None = None,
    persistent_keep: int = 2,
    replacements: Replacements = spare_pool,
) -> Job:
    """A leader, a watcher of its events, `spares` registered spares and unregistered members."""
    leader = Leader(
        LeaderSettings(JobShape(1, hosts), max_restarts, persistent_keep=persistent_keep),
        coordinator,
        persistent=persistent,  # type: ignore[arg-type]
        replacements=replacements,
    )
    port = await leader.serve("127.0.0.1", 0)
    [watcher] = await join(port, 1)
    await watcher.send("watch")
    assert (await watcher.receive())["type"] == "status"
    job = Job(leader, [], [], watcher, port=port)
    for spare in range(spares):
        job.spares.append(await spare_registers(port, spare))
        await job.event(f"spare {spare} (spare-{spare}) registered")
    job.members = await join(port, hosts)
    return job


async def register(member: Member) -> None:
    await member.send(
        "register",
        metrics_port=9100 + member.host,
        replica_address=replica_address(member.host),
        machine=f"host-{member.host}",
    )


async def job_with_spares(
    hosts: int = 3,
    spares: int = 1,
    max_restarts: int = 3,
    persistent: FakePersistent | None = None,
    persistent_keep: int = 2,
) -> Job:
    """Spares registered first, then every member: the `start` of generation 0 consumed."""
    job = await leader_with_spares(hosts, spares, max_restarts, persistent, persistent_keep)
    for member in job.members:
        await register(member)
    for member in job.members:
        start = await member.receive()
        assert (start["type"], start["generation"], start["restore_step"]) == ("start", 0, None)
    return job


async def nothing_arrives(member: Member, seconds: float = 0.1) -> bool:
    try:
        await asyncio.wait_for(member.reader.readline(), seconds)
    except TimeoutError:
        return True
    return False


async def lose(job: Job, host: int) -> None:
    """`host` fires the chaos fault `lose` and its supervisor's connection drops."""
    member = job.members[host]
    spec = f"lose:host={host}@step=5"
    await member.send(
        "chaos", kind="lose", step=5, t=100.0, generation=job.leader.memory.generation, fault=spec
    )
    await eventually(lambda: any(f.spec == spec for f in job.leader.memory.faults))
    member.close()


async def all_stop(members: list[Member], generation: int, kind: str) -> None:
    for member in members:
        message = await member.receive()
        message.pop("host")  # whose fault it is: checked where a test cares
        assert message == {"type": "stop", "generation": generation, "kind": kind}


async def assigned(spare: Member, host: int, generation: int, fired: list[str]) -> None:
    assert await spare.receive() == {"type": "assign", "host": host, "generation": generation, "fired": fired}
    spare.host = host


async def host_1_swapped_and_restarted(job: Job) -> None:
    """Two hosts: host 1 lost, spare 0 takes over and receives its `start` of generation 1."""
    await job.members[0].progress(0, step=12, t=90.0)
    await lose(job, 1)
    await all_stop(job.members[:1], generation=0, kind="host_lost")
    await assigned(job.spares[0], host=1, generation=0, fired=["lose:host=1@step=5"])
    await job.members[0].send("stopped", generation=0, committed=[10], replicas={"1": [10]})
    for member in (job.members[0], job.spares[0]):
        start = await member.receive()
        assert (start["type"], start["generation"], start["restore_step"]) == ("start", 1, 10)


async def running_job(
    hosts: int = 2, max_restarts: int = 3, max_restarts_without_progress: int = 3
) -> tuple[Leader, list[Member]]:
    """A leader with every member registered and the `start` of generation 0 consumed."""
    leader = Leader(
        LeaderSettings(
            JobShape(1, hosts), max_restarts, max_restarts_without_progress=max_restarts_without_progress
        ),
        coordinator,
    )
    port = await leader.serve("127.0.0.1", 0)
    members = await join(port, hosts)
    for member in members:
        await member.send("register", metrics_port=9100 + member.host)
    for member in members:
        start = await member.receive()
        assert (start["type"], start["generation"]) == ("start", 0)
    return leader, members


async def restart(members: list[Member], generation: int) -> list[dict[str, Any]]:
    """Fault on host 0, every member acks the stop; returns the `start` each member received."""
    await members[0].fault(generation)
    for member in members:
        assert (await member.receive())["type"] == "stop"
    for member in members:
        await member.send("stopped", generation=generation)
    return [await member.receive() for member in members]


async def killed_after_five_steps() -> tuple[Leader, list[Member]]:
    """Two hosts, five steps, host 1 killed at step 5 and the crash detected: every member stopping."""
    leader, members = await running_job(hosts=2)
    for step in (1, 2, 3, 4, 5):
        await members[0].progress(0, step=step, t=90.0 + step)
    await members[1].send("chaos", kind="kill", step=5, t=96.0, generation=0)
    await eventually(lambda: leader.memory.high_water == 5 and len(leader.memory.faults) == 1)
    await members[1].fault(0, kind="crash", t=97.5)
    for member in members:
        assert (await member.receive())["type"] == "stop"
    return leader, members


async def shut(leader: Leader, members: list[Member]) -> None:
    for member in members:
        member.close()
    await leader.close()
