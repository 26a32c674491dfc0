"""A group's relay: its hosts' supervisors reach the leader through one connection instead of one each.

One leader serving every host holds a connection per host, and every hand-over makes every host
connect and register again (issue 41: at 25,000 hosts, more connections than a process may open,
and a hand-over of tens of seconds). A relay, run by a supervisor of the group, takes its group's
members' connections and carries them to the leader over one connection of its own
(supervisor.relay_frames; the leader's side is supervisor.leader.relay_link), so the leader holds one
connection per group.

A member's connection to the relay begins with the leader it wants (messages.RelayTo: the one the
job's lease names); every later line is the member's, passed on unread, and every line the leader
sends for it comes back the same way, but for a bundle (a start of the whole group: what its members'
starts share, once, and what is each one's), which the relay makes into each member's own line; and
its members' acknowledgements of a stop, which go on gathered into one line (supervisor.host.
relay_acks).
The relay keeps one connection per leader asked for, opened at the first member's asking; when that
leader's connection ends (the leader lost, or standing down) the relay tells each member it carried
(messages.LEADER_GONE, after the leader's last lines) and keeps the member's connection: the member
finds the next leader as it would have and names it on that same connection, so a hand-over costs
the new leader one connection and handshake per relay, not per host (the members register again, as
rejoining members, over it). A member whose connection ends is said
to the leader as that member's connection ending (at its deadline of silence: as silent), so the
leader handles it as it handles any member's connection ending.

The relay never waits on one member: a member's lines are written without waiting for them to
leave, and one whose connection holds more than MEMBER_BUFFER_LIMIT unsent is dropped (its channel
ended: the leader handles it as a member whose connection ended, as it would its own drop).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import Awaitable, Callable

from slicekeeper.supervisor import connection_deadline, messages
from slicekeeper.supervisor.host.relay_acks import AckGathering
from slicekeeper.supervisor.leader_connection import (
    ATTEMPT_SECONDS,
    Connect,
    open_control_connection,
)
from slicekeeper.supervisor.relay_frames import END, OPEN, SILENT, FrameError, frame, lines_of, parse
from slicekeeper.supervisor.tls import JobTls

from slicekeeper import protocol

FRAME_ROOM = 1 << 20
"""Bytes a frame's header may add to a line: the relay reads the leader's lines this much longer."""
MEMBER_LINE_LIMIT = protocol.CONTROL_LINE_LIMIT - (1 << 10)
"""The longest line a member may send through a relay: framed, it stays within the leader's limit."""
END_WAIT_SECONDS = 5.0
"""How long a relay whose own supervisor ends keeps carrying its other members (supervisor.host.
served_host): at the job's end each gets its own word to end from the leader through it."""
RELAY_ATTEMPT_SECONDS = 1.0
"""A member's try of one relay of its group: on the job's own network a relay answers in milliseconds,
and a member whose relay is gone must reach the next one well within the leader's wait for it
(supervisor.leader.relay_link.REJOIN_SECONDS)."""
MEMBER_BUFFER_LIMIT = 4 * protocol.CONTROL_LINE_LIMIT
"""Bytes of the leader's lines a member's connection may hold unsent before the relay drops it."""

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
OpenUpstream = Callable[[str, int], Awaitable[Streams]]


class Upstream:
    """The relay's connection to one leader, and the members it carries there, by channel."""

    def __init__(self, address: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.address = address
        self.reader = reader
        self.writer = writer
        self.members: dict[int, asyncio.StreamWriter] = {}
        self.ended = False
        self.keeps_members = True
        """When this leader's connection ends its members' stay, for the next leader (False: the relay
        itself is closing)."""
        self._channels = itertools.count()
        self._unflushed: list[bytes] = []
        """Frames written in this turn of the event loop, to leave together at its end: the lines of
        members that spoke at once in one write, not one each."""
        self._acks = AckGathering(self._write)
        """Its members' acknowledgements of a stop, held to go on together in one line
        (supervisor.host.relay_acks)."""

    def _write(self, data: bytes) -> None:
        if not self._unflushed:
            asyncio.get_running_loop().call_soon(self._flush)
        self._unflushed.append(data)

    def _flush(self) -> None:
        data, self._unflushed = b"".join(self._unflushed), []
        if data and not self.writer.transport.is_closing():
            self.writer.write(data)

    def open(self, member: asyncio.StreamWriter) -> int | None:
        """A channel for `member` (None: this leader's connection ended meanwhile)."""
        if self.ended:
            return None
        channel = next(self._channels)
        self.members[channel] = member
        self._write(frame([channel], OPEN))
        return channel

    def send(self, channel: int, line: bytes) -> None:
        if not self.ended and channel in self.members and not self._acks.held(channel, line):
            self._write(frame([channel], line))

    def close_channel(self, channel: int, silent: bool) -> None:
        """The member's connection ended: the leader is told, unless it ended the channel itself."""
        if self.members.pop(channel, None) is not None and not self.ended:
            self._acks.gone(channel)
            self._write(frame([channel], SILENT if silent else END))

    async def run(self) -> None:
        """The leader's lines to their members, until the leader's connection ends; then every
        member's connection is closed (each finds the next leader)."""
        try:
            while line := await self.reader.readline():
                if not line.endswith(b"\n"):
                    break
                try:
                    received = parse(line)
                    lines = lines_of(received)
                except FrameError:
                    continue
                self._acks.stop_sent(received.channels, received.payload)
                for channel, payload in lines:
                    self._to_member(channel, payload)
        except (OSError, ValueError):  # reset, cut, silent at its deadline; a line over the limit
            pass
        finally:
            self.ended = True
            self._acks.close()
            self.writer.close()
            for member in list(self.members.values()):
                # After what it was sent (the job's end, a journal): its leader is gone, its connection
                # to the relay stays, and it says on it which leader is next (Relay._carry).
                if self.keeps_members:
                    member.write(messages.LEADER_GONE)
                else:
                    member.close()
            self.members.clear()

    def _to_member(self, channel: int, payload: bytes) -> None:
        member = self.members.get(channel)
        if member is None:
            return
        if payload in (END, SILENT):  # the leader dropped the member
            del self.members[channel]
            self._acks.gone(channel)
            member.transport.abort()
            return
        member.write(payload)
        if member.transport.get_write_buffer_size() > MEMBER_BUFFER_LIMIT:
            self.close_channel(channel, False)
            member.transport.abort()


class Relay:
    """The relay of group `group`: serves its members' connections, carries them to their leader."""

    def __init__(
        self,
        group: int,
        *,
        host: int | None = None,
        tls: JobTls | None = None,
        deadline: float = 0.0,
        say: Callable[[str], None] = lambda text: None,
    ) -> None:
        """`tls`: the job's credentials, for both sides (None: plain TCP, in unit tests); `deadline`:
        spec.health.connectionDeadlineSeconds, imposed on every connection it holds
        (supervisor.connection_deadline)."""
        self.group = group
        self.host = host
        """The host whose supervisor runs this relay (None: none, in the control-plane benchmark)."""
        self.tls = tls
        self.deadline = deadline
        self._say = say
        self.lease_seen: Callable[[], messages.LeaseSeen] = messages.LeaseSeen
        """The job's lease as this supervisor last saw it: the answer to a WhoLeads."""
        self._server: asyncio.Server | None = None
        self._upstreams: dict[str, Upstream] = {}
        self._opening: dict[str, asyncio.Task[Upstream | None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._connected: set[asyncio.StreamWriter] = set()
        """Every member connection it holds, carried to a leader or between two."""

    async def serve(self, address: str, port: int = 0, sock: socket.socket | None = None) -> int:
        """Listen for the group's members on address:port (or `sock`, bound already); the port."""
        if sock is not None:
            self._server = await asyncio.start_server(self._member, sock=sock, limit=MEMBER_LINE_LIMIT)
        else:
            self._server = await asyncio.start_server(self._member, address, port, limit=MEMBER_LINE_LIMIT)
        return int(self._server.sockets[0].getsockname()[1])

    def upstreams(self) -> list[str]:
        """The leaders it holds a connection to (normally one)."""
        return [address for address, upstream in self._upstreams.items() if not upstream.ended]

    async def close(self, wait: float = 0.0) -> None:
        """Stop serving: every upstream and member connection ends; `wait`: seconds its members have
        to end their connections first (the job's end reaching each: its supervisor ends as the
        others do, not only when the leader's last line to them crossed this relay)."""
        if self._server is not None:
            self._server.close()
        deadline = asyncio.get_running_loop().time() + wait
        while any(upstream.members for upstream in self._upstreams.values()):
            if asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(0.05)
        for upstream in list(self._upstreams.values()):
            upstream.keeps_members = False
            upstream.writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for member in list(self._connected):
            member.close()  # the relay goes: its members find the next one

    async def _member(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.tls is not None and not await self.tls.accept("relay", writer):
            return
        connection_deadline.impose_on(writer, self.deadline)
        try:
            asked = messages.relay_to(await reader.readline())
        except (OSError, ValueError):
            writer.close()
            return
        if isinstance(asked, messages.WhoLeads):
            await self._answer(writer)
            return
        leader: str | None = asked.leader
        self._connected.add(writer)
        try:
            while leader is not None:
                leader = await self._carry(leader, reader, writer)
        finally:
            self._connected.discard(writer)
            writer.close()  # the member tries again, or finds the next leader
            self._let_go_of_idle()

    async def _carry(
        self, leader: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> str | None:
        """The member's lines to `leader`, until the member's connection ends (None) or the leader's
        does: then, once told (LEADER_GONE), the member names the next leader on the same connection,
        which is returned (its lines sent meanwhile had no leader to go to)."""
        upstream = await self._upstream(leader)
        channel = upstream.open(writer) if upstream is not None else None
        if upstream is None or channel is None:
            return None
        silent = False
        try:
            while line := await reader.readline():
                if not line.endswith(b"\n"):
                    break
                if not upstream.ended:
                    upstream.send(channel, line)
                elif (next_leader := _next_leader(line)) is not None:
                    return next_leader
        except TimeoutError:  # its deadline of silence (supervisor.connection_deadline)
            silent = True
        except (OSError, ValueError):  # reset, a cut TLS stream; a line over the limit
            pass
        except asyncio.CancelledError:
            pass
        finally:
            upstream.close_channel(channel, silent)
        return None

    async def _answer(self, writer: asyncio.StreamWriter) -> None:
        """Whom the lease names, as this supervisor saw it last, to a supervisor that does not read
        the lease (supervisor.host.leadership)."""
        writer.write(self.lease_seen().encode())
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(writer.drain(), ATTEMPT_SECONDS)
        writer.close()

    async def _upstream(self, address: str) -> Upstream | None:
        """The connection to the leader at `address`, opened if there is none (None: it does not
        answer)."""
        upstream = self._upstreams.get(address)
        if upstream is not None and not upstream.ended:
            return upstream
        opening = self._opening.get(address)
        if opening is None:
            opening = asyncio.create_task(self._open(address))
            self._opening[address] = opening
            opening.add_done_callback(lambda _: self._opening.pop(address, None))
        return await asyncio.shield(opening)

    async def _open(self, address: str) -> Upstream | None:
        host, _, port = address.rpartition(":")
        try:
            reader, writer = await asyncio.wait_for(
                open_control_connection(host, int(port), self.tls, protocol.CONTROL_LINE_LIMIT + FRAME_ROOM),
                ATTEMPT_SECONDS,
            )
        except (OSError, ValueError, TimeoutError) as error:
            self._say(f"relay of group {self.group}: the leader at {address} does not answer: {error}")
            return None
        connection_deadline.impose_on(writer, self.deadline)
        writer.write(messages.RelayHello(group=self.group, host=self.host).encode())
        upstream = Upstream(address, reader, writer)
        self._upstreams[address] = upstream
        self._say(f"relay of group {self.group}: carrying its members to the leader at {address}")
        task = asyncio.create_task(upstream.run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._let_go_of_idle()
        return upstream

    def _let_go_of_idle(self) -> None:
        """Close the connections to earlier leaders that carry no member any more."""
        newest = next(reversed(self._upstreams), None)
        for address, upstream in list(self._upstreams.items()):
            if upstream.ended or (address != newest and not upstream.members):
                del self._upstreams[address]
                with contextlib.suppress(OSError):
                    upstream.writer.close()


def _next_leader(line: bytes) -> str | None:
    """The leader a member names on `line` once its own is gone (None: another of its lines)."""
    if b'"relay_to"' not in line:
        return None
    try:
        asked = messages.relay_to(line)
    except ValueError:
        return None
    return asked.leader if isinstance(asked, messages.RelayTo) else None


def via_relay(relay: str, tls: JobTls | None) -> Connect:
    """How a member connects to the leader at (host, port) through the relay at `relay` ("host:port"):
    the same streams as a direct connection (reach_leader's `open_connection`,
    supervisor.leader_connection)."""
    relay_host, _, relay_port = relay.rpartition(":")

    async def connect(host: str, port: int) -> Streams:
        reader, writer = await open_control_connection(relay_host, int(relay_port), tls)
        writer.write(messages.RelayTo(leader=f"{host}:{port}").encode())
        return reader, writer

    return connect


def through_relays(relays: list[str], tls: JobTls | None) -> Connect:
    """How a member connects to the leader at (host, port): through the first of `relays` that
    answers, in order, or directly when none does (or there is none)."""

    async def connect(host: str, port: int) -> Streams:
        for relay in relays:
            with contextlib.suppress(OSError, TimeoutError):
                return await asyncio.wait_for(via_relay(relay, tls)(host, port), RELAY_ATTEMPT_SECONDS)
        return await open_control_connection(host, port, tls)

    return connect
