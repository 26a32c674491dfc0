"""One member that stops reading holds up no other: the leader writes each command to every member
without waiting for any, and drops a member whose connection does not take its commands in time,
which it then handles as a lost host, once.

Every test drives a real Leader over 127.0.0.1 (plain TCP, and TLS as in a job) with members speaking
JSON lines (tests/support/fake_members.py). One member stops reading: its receive buffer is small and
its reading paused, so what the leader writes to it stays in the leader's buffers once the kernel's
are full, while the leader broadcasts journals of a MiB each, more than the kernel's take. The
negative control broadcasts as the leader did before, writing to each member and waiting for its
connection to drain in turn, and shows that the check catches that: the members after the stalled
one wait for ever.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader import Leader
from slicekeeper.supervisor.leader.members import MEMBER_BUFFER_LIMIT, Members, send
from slicekeeper.supervisor.leader.settings import LeaderSettings
from slicekeeper.supervisor.tls import JobTls

from slicekeeper import credentials, protocol
from slicekeeper.shape import JobShape
from tests.support.fake_members import WAIT, Member, coordinator, run

pytestmark = pytest.mark.alone
"""The on-time members must read 8 MiB of journals (over TLS, in one process with the leader) within
the 1 s drain deadline: beside another worker's run, one was dropped as stalled (a fresh clone's
make test with two workers)."""

HOSTS = 20
STALLED = 7
"""The member that stops reading: others before and after it in the leader's table."""
LINE = 1 << 20
"""Bytes of padding in each broadcast journal."""
BROADCASTS = 8
"""Journals broadcast: more than a stalled connection's kernel buffers take (about 3 MiB here)."""
RECEIVE_BUFFER = 16 << 10
"""The stalled member's socket receive buffer (SO_RCVBUF): small, so it fills at once."""
ON_TIME = 2.0
"""Seconds within which every other member must have read every broadcast journal: loopback carries
them in a fraction of that; a member held up waits for ever (or the deadline)."""
DEADLINE = 1.0
"""The drain deadline of the tests that see a member dropped."""

Broadcast = Callable[[Members, messages.Message], Awaitable[None]]


async def serial_broadcast(members: Members, message: messages.Message) -> None:
    """The broadcast as the leader wrote it before: each member's connection written and drained in
    turn, so one that does not drain holds up every member after it, and every broadcast after."""
    for writer in list(members.writers.values()):
        await send(writer, message)


def journal(seq: int) -> messages.Journal:
    return messages.Journal(seq=seq, journal={"padding": "x" * LINE})


@dataclass
class Job:
    leader: Leader
    members: list[Member]
    watcher: Member
    stalled: Member
    events: list[str] = field(default_factory=list)

    @property
    def others(self) -> list[Member]:
        return [member for member in self.members if member is not self.stalled]

    async def event(self, fragment: str) -> str:
        """The first event (seen so far or next) whose text contains `fragment`."""
        while True:
            for text in self.events:
                if fragment in text:
                    return text
            message = await self.watcher.receive()
            if message["type"] == "event":
                self.events.append(message["text"])

    async def all_events(self) -> list[str]:
        """Every event so far: the watcher read until nothing more comes for a moment."""
        while True:
            try:
                message = await asyncio.wait_for(self.watcher.receive(), 0.2)
            except TimeoutError:
                return self.events
            if message["type"] == "event":
                self.events.append(message["text"])

    async def shut(self) -> None:
        for member in [*self.members, self.watcher]:
            member.close()
        await self.leader.close()


async def connect(
    port: int, tls: JobTls | None, receive_buffer: int | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:  # before connecting: the window it advertises follows from it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    if tls is None:
        return await asyncio.open_connection(sock=sock, limit=protocol.CONTROL_LINE_LIMIT)
    return await asyncio.open_connection(
        sock=sock, limit=protocol.CONTROL_LINE_LIMIT, ssl=tls.client, server_hostname=""
    )


async def running_job(
    tls: JobTls | None = None,
    hosts: int = HOSTS,
    stalled: int = STALLED,
    drain_deadline: float = DEADLINE,
    buffer_limit: int = MEMBER_BUFFER_LIMIT,
) -> Job:
    """A running job whose member `stalled` stopped reading once it read its `start`; its leader
    drops a connection after `drain_deadline` or past `buffer_limit`."""
    leader = Leader(LeaderSettings(JobShape(1, hosts), 3), coordinator)
    leader.members.drain_deadline, leader.members.buffer_limit = drain_deadline, buffer_limit
    port = await leader.serve("127.0.0.1", 0, tls=tls)
    watcher = Member(0, *await connect(port, tls))
    await watcher.send("watch")
    assert (await watcher.receive())["type"] == "status"
    members = []
    for host in range(hosts):
        buffer = RECEIVE_BUFFER if host == stalled else None
        members.append(Member(host, *await connect(port, tls, buffer)))
    for member in members:
        await member.send("register", metrics_port=9100 + member.host)
    for member in members:
        assert (await member.receive())["type"] == "start"
    members[stalled].writer.transport.pause_reading()
    return Job(leader, members, watcher, members[stalled])


def broadcasting(job: Job, broadcast: Broadcast) -> asyncio.Task[None]:
    """The leader broadcasts BROADCASTS journals, one after the other, as its parts do."""

    async def journals() -> None:
        for seq in range(1, BROADCASTS + 1):
            await broadcast(job.leader.members, journal(seq))

    return asyncio.ensure_future(journals())


async def late(members: list[Member], seconds: float = ON_TIME) -> set[int]:
    """The hosts among `members` that had not read every broadcast journal, in order, `seconds` from
    now."""
    until = asyncio.get_running_loop().time() + seconds

    async def read_all(member: Member) -> bool:
        seqs = []
        try:
            async with asyncio.timeout_at(until):
                while len(seqs) < BROADCASTS:
                    seqs.append(protocol.decode(await member.reader.readline())["seq"])
        except TimeoutError:
            return False
        assert seqs == list(range(1, BROADCASTS + 1))  # one member's commands stay in order
        return True

    on_time = await asyncio.gather(*(read_all(member) for member in members))
    return {member.host for member, read in zip(members, on_time, strict=True) if not read}


@pytest.fixture(scope="module")
def job_credentials(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return credentials.generate("slow-member").write(tmp_path_factory.mktemp("credentials") / "own")


@pytest.fixture(params=["tcp", "tls"])
def tls(request: pytest.FixtureRequest, job_credentials: Path) -> JobTls | None:
    return JobTls(job_credentials) if request.param == "tls" else None


# --- the others get their commands on time ----------------------------------------------------------


def test_every_other_member_reads_each_broadcast_at_once_while_one_stops_reading(tls):
    async def scenario() -> None:
        job = await running_job(tls, drain_deadline=60.0)  # the others must not wait for it to pass
        broadcasts = broadcasting(job, Members.broadcast)
        assert await late(job.others) == set()
        assert broadcasts.done()  # the leader's own work went on at once too
        assert STALLED in job.leader.members  # not dropped: its deadline is far off
        await job.shut()

    run(scenario)


def test_the_negative_control_a_serial_broadcast_holds_up_every_member_after_the_stalled_one():
    async def scenario() -> None:
        job = await running_job(drain_deadline=60.0)  # as before: nothing dropped in the meantime
        broadcasts = broadcasting(job, serial_broadcast)
        held_up = await late(job.others)
        assert set(range(STALLED + 1, HOSTS)) <= held_up, held_up
        assert not broadcasts.done()  # the broadcast waits for the stalled member for ever
        broadcasts.cancel()
        await job.shut()

    run(scenario)


def test_a_command_to_a_stalled_member_neither_waits_nor_holds_up_the_next_to_another():
    async def scenario() -> None:
        job = await running_job(hosts=2, stalled=1, drain_deadline=60.0)
        async with asyncio.timeout(ON_TIME):
            for seq in range(1, BROADCASTS + 1):
                await job.leader.members.send(1, journal(seq))
            await job.leader.members.send_to(job.leader.members.writers[1], journal(BROADCASTS + 1))
            await job.leader.members.send(0, messages.ActivityRequest(generation=0))
            assert await job.members[0].receive() == {"type": "activity_request", "generation": 0}
        assert 1 in job.leader.members
        await job.shut()

    run(scenario)


# --- the stalled member is dropped, and lost once ---------------------------------------------------


def test_a_member_that_stops_reading_is_dropped_after_the_deadline_and_handled_as_lost_once(tls):
    async def scenario() -> None:
        job = await running_job(tls)
        started = asyncio.get_running_loop().time()
        broadcasting(job, Members.broadcast)
        assert await late(job.others) == set()
        dropped = await job.event(f"host {STALLED} dropped")
        waited = asyncio.get_running_loop().time() - started
        assert DEADLINE <= waited < DEADLINE + ON_TIME
        assert re.fullmatch(
            rf"host {STALLED} dropped: its connection did not drain [0-9.]+ MiB of commands within 1 s",
            dropped,
        )
        for member in job.others:
            stop = await member.receive()
            assert stop == {"type": "stop", "generation": 0, "kind": "host_lost", "host": STALLED}
        await asyncio.sleep(2 * DEADLINE)  # time enough for a second drop or loss, were there one
        events = await job.all_events()
        assert [text for text in events if "dropped" in text] == [dropped]
        assert job.leader.memory.restarts == {"host_lost": 1}
        assert [(d.kind, d.host) for d in job.leader.memory.detections] == [("host_lost", STALLED)]
        assert job.leader.status[STALLED].state == "lost" and STALLED not in job.leader.members
        await job.shut()

    run(scenario)


def test_a_member_holding_more_than_the_bound_is_dropped_without_waiting_for_the_deadline():
    async def scenario() -> None:
        job = await running_job(hosts=3, stalled=1, drain_deadline=60.0, buffer_limit=2 * LINE)
        stalled = job.leader.members.writers[1]
        for seq in range(1, BROADCASTS + 1):
            if stalled.transport.is_closing():
                break  # dropped: what comes next is the leader's own
            await job.leader.members.broadcast(journal(seq))
            for other in job.others:  # they read each one before the next: only the stalled one fills
                line = await asyncio.wait_for(other.reader.readline(), WAIT)
                assert protocol.decode(line)["seq"] == seq
        dropped = await job.event("host 1 dropped")
        assert re.fullmatch(
            r"host 1 dropped: its connection holds [0-9.]+ MiB of commands, over 2\.0 MiB", dropped
        )
        for member in job.others:
            assert await member.receive() == {"type": "stop", "generation": 0, "kind": "host_lost", "host": 1}
        assert job.leader.memory.restarts == {"host_lost": 1}
        await job.shut()

    run(scenario)


def test_a_member_that_reads_again_within_the_deadline_is_kept():
    async def scenario() -> None:
        job = await running_job(hosts=2, stalled=1, drain_deadline=3 * DEADLINE)
        broadcasting(job, Members.broadcast)
        await asyncio.sleep(DEADLINE / 2)
        job.stalled.writer.transport.resume_reading()
        assert await late([job.stalled], WAIT) == set()
        await asyncio.sleep(3 * DEADLINE)  # past the deadline of every journal written
        assert 1 in job.leader.members and job.leader.status[1].state != "lost"
        assert not [text for text in await job.all_events() if "dropped" in text]
        assert job.leader.memory.restarts == {}
        await job.shut()

    run(scenario)
