"""A group's members reach the leader through one relay: one connection to the leader for the group.

A real Leader and a real Relay (supervisor/host/relay.py) on 127.0.0.1 (plain TCP, and TLS on both of
the relay's sides as in a job), with fake members speaking the supervisors' protocol through the relay
(tests/support/fake_members.py). The leader serves each member behind the relay with the code that
serves a member connected to it directly (supervisor/leader/relay_link.py): registrations, a fault
and the stop that follows, a member's connection ending as its host lost, a member dropped by the
leader, the relay's own loss ending every member's connection. The negative control: a relay that
hands each of the leader's lines to every member of its group is caught by the check that a command
reaches its member alone.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
from slicekeeper.supervisor import messages, relay_frames
from slicekeeper.supervisor.host import relay as relay_module
from slicekeeper.supervisor.host.relay import Relay, through_relays, via_relay
from slicekeeper.supervisor.leader import Leader, relay_link
from slicekeeper.supervisor.leader.members import Members
from slicekeeper.supervisor.leader.relay_link import ChannelTransport
from slicekeeper.supervisor.leader.settings import LeaderSettings
from slicekeeper.supervisor.ports import free_port
from slicekeeper.supervisor.tls import JobTls

from slicekeeper import credentials
from slicekeeper.shape import JobShape
from tests.support.fake_members import Member, coordinator, eventually, run

HOSTS = 8
QUIET = 0.3
"""Seconds a member that should hear nothing listens for a line."""


@dataclass
class RelayedJob:
    leader: Leader
    relay: Relay
    members: list[Member]
    leader_address: str

    async def shut(self) -> None:
        for member in self.members:
            member.close()
        await self.relay.close()
        await self.leader.close()


@pytest.fixture(scope="module")
def job_credentials(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return credentials.generate("relays").write(tmp_path_factory.mktemp("credentials") / "own")


@pytest.fixture(params=["plain", "tls"])
def tls(request: pytest.FixtureRequest, job_credentials: Path) -> JobTls | None:
    return JobTls(job_credentials) if request.param == "tls" else None


async def relayed_job(tls: JobTls | None = None, hosts: int = HOSTS) -> RelayedJob:
    """A job of `hosts` members, every one registered through one relay and given its start."""
    leader = Leader(LeaderSettings(JobShape(2, hosts // 2), 3), coordinator)
    port = await leader.serve("127.0.0.1", 0, tls=tls)
    relay = Relay(0, tls=tls)
    connect = via_relay(f"127.0.0.1:{await relay.serve('127.0.0.1')}", tls)
    members = [Member(host, *await connect("127.0.0.1", port)) for host in range(hosts)]
    for member in members:
        await member.send("register", metrics_port=9100 + member.host)
    for member in members:
        assert (await member.receive())["type"] == "start"
    return RelayedJob(leader, relay, members, f"127.0.0.1:{port}")


def links(writers: Iterable[asyncio.StreamWriter]) -> set[object]:
    """The relay connections `writers` go through."""
    return {w.transport.link for w in writers if isinstance(w.transport, ChannelTransport)}


async def silent(member: Member) -> bool:
    """Whether `member` hears nothing for QUIET seconds."""
    try:
        await asyncio.wait_for(member.reader.readline(), QUIET)
    except TimeoutError:
        return True
    return False


# --- one connection for the group ------------------------------------------------------------------


def test_every_member_registers_and_starts_through_one_relay_connection(tls):
    async def scenario() -> None:
        job = await relayed_job(tls)
        writers = job.leader.members.writers
        assert sorted(writers) == list(range(HOSTS))
        transports = [writer.transport for writer in writers.values()]
        assert all(isinstance(t, ChannelTransport) for t in transports)
        assert len({t.link for t in transports if isinstance(t, ChannelTransport)}) == 1
        assert job.relay.upstreams() == [job.leader_address]
        await job.shut()

    run(scenario)


def test_a_fault_reported_through_the_relay_stops_every_member(tls):
    async def scenario() -> None:
        job = await relayed_job(tls)
        await job.members[5].fault(0)
        for member in job.members:
            stop = await member.receive()
            assert (stop["type"], stop["kind"], stop["host"]) == ("stop", "crash", 5)
        await job.shut()

    run(scenario)


# --- each command to its member alone ---------------------------------------------------------------


async def who_hears_a_command_to(host: int) -> set[int]:
    job = await relayed_job()
    await job.leader.members.send(host, messages.ActivityRequest(generation=0))
    heard = {member.host for member in job.members if not await silent(member)}
    await job.shut()
    return heard


def test_a_command_to_one_member_reaches_it_alone():
    async def scenario() -> None:
        assert await who_hears_a_command_to(3) == {3}

    run(scenario)


def test_negative_control_a_relay_that_hands_every_line_to_the_whole_group_is_caught(monkeypatch):
    def to_everyone(self: relay_module.Upstream, channel: int, payload: bytes) -> None:
        for member in self.members.values():
            member.write(payload)

    monkeypatch.setattr(relay_module.Upstream, "_to_member", to_everyone)

    async def scenario() -> None:
        assert await who_hears_a_command_to(3) == set(range(HOSTS))

    run(scenario)


async def frames_of_a_broadcast() -> tuple[int, set[int]]:
    """The frames the relay reads from the leader for one broadcast to the 8 members behind it, and
    the members that got it."""
    job = await relayed_job()
    frames: list[relay_frames.Frame] = []

    def counted(line: bytes) -> relay_frames.Frame:
        frames.append(relay_frames.parse(line))
        return frames[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(relay_module, "parse", counted)
        await job.leader.members.broadcast(messages.ActivityRequest(generation=0))
        heard = {m.host for m in job.members if (await m.receive())["type"] == "activity_request"}
    await job.shut()
    return len(frames), heard


def test_a_broadcast_reaches_every_member_behind_a_relay_in_one_frame():
    async def scenario() -> None:
        assert await frames_of_a_broadcast() == (1, set(range(HOSTS)))

    run(scenario)


def test_negative_control_a_broadcast_written_to_each_member_is_a_frame_each(monkeypatch):
    def one_by_one(self: Members, writers: list[asyncio.StreamWriter], line: bytes) -> None:
        for writer in writers:
            self._write(writer, line)

    monkeypatch.setattr(Members, "_write_each", one_by_one)

    async def scenario() -> None:
        assert await frames_of_a_broadcast() == (HOSTS, set(range(HOSTS)))

    run(scenario)


class RecordedConnection:
    """A relay's connection as the leader writes to it: each write kept, nothing ever waiting to leave."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.transport = self

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0


def test_the_frames_of_one_turn_of_the_loop_leave_in_one_write_in_order():
    """A start of every host behind a relay is a frame each; they leave the leader together, one
    write (one TLS record, one send) at the end of the loop's turn, not one a host."""

    async def scenario() -> None:
        connection = RecordedConnection()
        link = relay_link.RelayLink(asyncio.StreamReader(), connection, None, 1.0)  # type: ignore[arg-type]
        written = [link.write([channel], f"start {channel}\n".encode()) for channel in range(3)]
        assert connection.writes == [] and link.gone() == 0  # not left yet: none counted as gone
        await asyncio.sleep(0)
        assert connection.writes == [b"0 start 0\n1 start 1\n2 start 2\n"]
        assert link.gone() == written[-1][0] == len(connection.writes[0])

    run(scenario)


async def frames_of_a_start() -> tuple[int, dict[int, dict[str, object]]]:
    """The frames carrying a start that the relay reads from the leader when the 8 members behind it
    start generation 0, and the start each member got."""
    frames: list[relay_frames.Frame] = []

    def counted(line: bytes) -> relay_frames.Frame:
        parsed = relay_frames.parse(line)
        if b'"type":"start"' in parsed.payload:
            frames.append(parsed)
        return parsed

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(relay_module, "parse", counted)
        leader = Leader(LeaderSettings(JobShape(2, HOSTS // 2), 3), coordinator)
        port = await leader.serve("127.0.0.1", 0)
        relay = Relay(0)
        connect = via_relay(f"127.0.0.1:{await relay.serve('127.0.0.1')}", None)
        members = [Member(host, *await connect("127.0.0.1", port)) for host in range(HOSTS)]
        for member in members:
            await member.send("register", metrics_port=9100 + member.host)
        starts = {member.host: await member.receive() for member in members}
    await RelayedJob(leader, relay, members, "").shut()
    return len(frames), starts


def test_a_start_of_every_member_behind_a_relay_is_one_frame_each_member_its_own_start():
    """The world and the coordinator once, in one bundle; each member's start its own (its rank),
    whole, as if the leader had written it to the member alone."""

    async def scenario() -> None:
        frames, starts = await frames_of_a_start()
        assert frames == 1
        assert {host: start["rank"] for host, start in starts.items()} == {h: h for h in range(HOSTS)}
        for start in starts.values():
            whole = messages.Start.model_validate(start)
            assert (whole.hosts, whole.generation, whole.term) == (list(range(HOSTS)), 0, 0)

    run(scenario)


def test_negative_control_starts_written_to_each_member_are_a_frame_each(monkeypatch):
    async def one_by_one(
        self: Members, common: dict[str, object], each: dict[int, dict[str, object]]
    ) -> None:
        for host, own in each.items():
            await self.send(host, messages.Start.model_validate(common | own))

    monkeypatch.setattr(Members, "send_own", one_by_one)

    async def scenario() -> None:
        frames, starts = await frames_of_a_start()
        assert (frames, sorted(starts)) == (HOSTS, list(range(HOSTS)))

    run(scenario)


async def acks_of_a_stop() -> tuple[list[int], dict[int, int]]:
    """The channels of each frame carrying acknowledgements the leader reads from the relay when the
    8 members behind it acknowledge a stop, and the generation each member is started in next."""
    carried: list[int] = []

    def counted(line: bytes) -> relay_frames.Frame:
        parsed = relay_frames.parse(line)
        if b'"type":"stopped"' in parsed.payload:
            carried.append(len(parsed.channels))
        return parsed

    job = await relayed_job()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(relay_link, "parse", counted)
        await job.members[5].fault(0)
        for member in job.members:
            assert (await member.receive())["type"] == "stop"
        for member in job.members:
            await member.send("stopped", generation=0, committed=[])
        started = {member.host: (await member.receive())["generation"] for member in job.members}
    await job.shut()
    return carried, started


def test_a_stops_acknowledgements_reach_the_leader_in_one_frame_and_the_job_starts_again():
    async def scenario() -> None:
        assert await acks_of_a_stop() == ([HOSTS], dict.fromkeys(range(HOSTS), 1))

    run(scenario)


def test_negative_control_acknowledgements_sent_on_alone_are_a_frame_each(monkeypatch):
    monkeypatch.setattr(relay_module.AckGathering, "held", lambda self, channel, line: False)

    async def scenario() -> None:
        assert await acks_of_a_stop() == ([1] * HOSTS, dict.fromkeys(range(HOSTS), 1))

    run(scenario)


# --- ends -------------------------------------------------------------------------------------------


def test_a_members_connection_to_the_relay_ending_is_its_host_lost_once():
    async def scenario() -> None:
        job = await relayed_job()
        job.members[6].close()
        others = [member for member in job.members if member.host != 6]
        for member in others:
            stop = await member.receive()
            assert (stop["type"], stop["kind"], stop["host"]) == ("stop", "host_lost", 6)
        await eventually(lambda: 6 not in job.leader.members)
        assert job.leader.memory.restarts == {"host_lost": 1}
        assert all(member.host in job.leader.members for member in others)
        await job.shut()

    run(scenario)


def test_a_member_the_leader_drops_has_its_connection_closed_by_the_relay():
    async def scenario() -> None:
        job = await relayed_job()
        job.leader.members.writers[2].transport.abort()  # as its drain deadline would
        assert await asyncio.wait_for(job.members[2].reader.read(), 5.0) == b""  # closed
        await eventually(lambda: 2 not in job.leader.members)
        for member in job.members:
            if member.host != 2:
                stop = await member.receive()
                assert (stop["type"], stop["kind"], stop["host"]) == ("stop", "host_lost", 2)
        await job.shut()

    run(scenario)


def test_a_lost_relays_members_that_do_not_come_back_are_each_lost_after_the_wait(monkeypatch):
    monkeypatch.setattr(relay_link, "REJOIN_SECONDS", 0.5)

    async def scenario() -> None:
        job = await relayed_job()
        await job.relay.close()
        for member in job.members:
            assert await asyncio.wait_for(member.reader.read(), 5.0) == b""
        await eventually(lambda: not job.leader.members.writers)
        assert all(job.leader.status[host].state == "lost" for host in range(HOSTS))
        await job.shut()

    run(scenario)


async def restarts_when_a_relay_is_lost_and_its_members_rejoin_through_the_next() -> dict[str, int]:
    """Every member's relay lost; each rejoins at once through the group's next relay, in the
    generation it is in, as supervisor.host.membership does: the leader's restarts after that."""
    job = await relayed_job()
    standby = Relay(0)
    connect = via_relay(f"127.0.0.1:{await standby.serve('127.0.0.1')}", None)
    writers = job.leader.members.writers
    lost_link = links(writers.values())
    await job.relay.close()
    port = int(job.leader_address.rsplit(":", 1)[1])
    members = []
    for member in job.members:
        assert await asyncio.wait_for(member.reader.read(), 5.0) == b""
        members.append(Member(member.host, *await connect("127.0.0.1", port)))
        await members[-1].send("register", metrics_port=9100 + member.host, generation=0, step=3)
    await eventually(
        lambda: (
            (len(writers) == HOSTS and not links(writers.values()) & lost_link)
            or "host_lost" in job.leader.memory.restarts
        )
    )
    await asyncio.sleep(QUIET)
    restarts = dict(job.leader.memory.restarts)
    for member in members:
        member.close()
    await standby.close()
    await job.shut()
    return restarts


def test_a_lost_relays_members_rejoining_through_the_next_relay_are_not_lost():
    async def scenario() -> None:
        assert await restarts_when_a_relay_is_lost_and_its_members_rejoin_through_the_next() == {}

    run(scenario)


def test_negative_control_with_no_wait_for_them_a_lost_relays_members_are_lost(monkeypatch):
    monkeypatch.setattr(relay_link, "REJOIN_SECONDS", 0.0)

    async def scenario() -> None:
        restarts = await restarts_when_a_relay_is_lost_and_its_members_rejoin_through_the_next()
        assert restarts.get("host_lost", 0) >= 1, restarts

    run(scenario)


# --- a hand-over of relays, not of hosts -------------------------------------------------------------


async def members_after_their_leader_goes(keeps_members: bool) -> tuple[list[bytes], int, set[object]]:
    """The job's leader closes (as a leader lost); a leader of the next term serves elsewhere. Each
    member reads what its relay says, then names the next leader on the same connection and
    registers with it there. Returns what each member read, how many members the next leader started,
    and the relay connections they reach it through."""
    job = await relayed_job()
    if not keeps_members:  # the relay as it was: the members' connections end with their leader's
        for upstream in job.relay._upstreams.values():
            upstream.keeps_members = False
    following = Leader(LeaderSettings(JobShape(2, HOSTS // 2), 3), coordinator, term=2)
    port = await following.serve("127.0.0.1", 0)
    await job.leader.close()
    said = [await asyncio.wait_for(member.reader.readline(), 5.0) for member in job.members]
    started = 0
    if all(line == messages.LEADER_GONE for line in said):
        for member in job.members:
            member.writer.write(messages.RelayTo(leader=f"127.0.0.1:{port}").encode())
            await member.send("register", metrics_port=9100 + member.host)
        started = sum([(await member.receive())["type"] == "start" for member in job.members])
    through = links(following.members.writers.values())
    await following.close()
    await job.shut()
    return said, started, through


def test_a_relay_keeps_its_members_connections_for_the_next_leader():
    """No member connects or handshakes again: each names the next leader on its connection to the
    relay, and the next leader serves them all through the relay's one new connection."""

    async def scenario() -> None:
        said, started, through = await members_after_their_leader_goes(keeps_members=True)
        assert said == [messages.LEADER_GONE] * HOSTS
        assert started == HOSTS and len(through) == 1

    run(scenario)


def test_negative_control_a_relay_that_closes_its_members_with_their_leader_is_caught():
    async def scenario() -> None:
        said, started, _ = await members_after_their_leader_goes(keeps_members=False)
        assert said == [b""] * HOSTS and started == 0  # every member would connect again

    run(scenario)


# --- which relay a member goes through ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("hosts_per_relay", "groups"),
    [
        (2, [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]),  # a slice a group
        (3, [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9)]),  # whole slices: two, the last group one
        (64, [tuple(range(10))]),  # more than the job: one group
    ],
)
def test_a_relay_group_is_whole_slices_its_first_host_first(hosts_per_relay, groups):
    shape = JobShape(5, 2)
    assert [shape.relay_group(group[0], hosts_per_relay) for group in groups] == groups
    for number, group in enumerate(groups):
        assert all(shape.relay_group(host, hosts_per_relay) == group for host in group)
        assert {shape.relay_group_of(host, hosts_per_relay) for host in group} == {number}


def test_a_member_goes_through_the_first_relay_that_answers_and_else_directly():
    async def scenario() -> None:
        leader = Leader(LeaderSettings(JobShape(1, 2), 3), coordinator)
        port = await leader.serve("127.0.0.1", 0)
        relay = Relay(0)
        answering = f"127.0.0.1:{await relay.serve('127.0.0.1')}"
        dead = f"127.0.0.1:{free_port()}"  # nobody listens there
        through = Member(0, *await through_relays([dead, answering], None)("127.0.0.1", port))
        direct = Member(1, *await through_relays([dead], None)("127.0.0.1", port))
        for member in (through, direct):
            await member.send("register", metrics_port=9100 + member.host)
        for member in (through, direct):
            assert (await member.receive())["type"] == "start"
        transports = {host: writer.transport for host, writer in leader.members.writers.items()}
        assert isinstance(transports[0], ChannelTransport)
        assert not isinstance(transports[1], ChannelTransport)
        through.close()
        direct.close()
        await relay.close()
        await leader.close()

    run(scenario)


# --- the frames on a relay's connection ------------------------------------------------------------


@pytest.mark.parametrize(
    ("channels", "line"),
    [
        ([0], b'{"type":"register","host":0}\n'),
        ([3, 17, 250], b'{"type":"stop"}\n'),
        ([5], relay_frames.OPEN),
    ],
)
def test_a_frame_reads_back_as_its_channels_and_line(channels, line):
    framed = relay_frames.frame(channels, line)
    assert framed.endswith(b"\n") and framed.count(b"\n") == 1
    parsed = relay_frames.parse(framed)
    assert (list(parsed.channels), parsed.payload) == (channels, line)
    assert parsed.control == (line if line in relay_frames.CONTROLS else None)


@pytest.mark.parametrize(
    "line",
    [b'{"type":"stop"}\n', b"x1 -\n", b"1,,2 -\n", b"-1 -\n", b"1 \n", b"1 -", b" -\n"],
)
def test_a_line_that_is_not_a_frame_is_refused_by_name(line):
    with pytest.raises(relay_frames.FrameError):
        relay_frames.parse(line)


@pytest.mark.parametrize(("channels", "line"), [([], b"{}\n"), ([1], b"{}"), ([1], b"{}\n{}\n")])
def test_only_one_whole_line_for_at_least_one_channel_is_framed(channels, line):
    with pytest.raises(relay_frames.FrameError):
        relay_frames.frame(channels, line)


def test_a_bundle_gives_each_channel_its_own_line_over_what_they_share():
    framed = relay_frames.bundle([4, 9], {"type": "start", "world": "0-1"}, [{"rank": 0}, {"rank": 1}])
    lines = relay_frames.lines_of(relay_frames.parse(framed))
    assert [(channel, json.loads(line)) for channel, line in lines] == [
        (4, {"type": "start", "world": "0-1", "rank": 0}),
        (9, {"type": "start", "world": "0-1", "rank": 1}),
    ]
    assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for _, line in lines)


@pytest.mark.parametrize(
    "payload",
    [b"*not json\n", b'*{"common":{}}\n', b'*{"common":{},"each":[{}]}\n', b'*{"common":{},"each":[1,2]}\n'],
    ids=["not-json", "no-each", "too-few", "not-objects"],
)
def test_a_bundle_that_does_not_give_each_channel_a_line_is_refused(payload):
    with pytest.raises(relay_frames.FrameError):
        relay_frames.lines_of(relay_frames.Frame((1, 2), payload))
    with pytest.raises(relay_frames.FrameError):
        relay_frames.bundle([1, 2], {}, [{}])
