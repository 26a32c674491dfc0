"""The leader's side of its connections: who is connected as which host, and how to reach them.

Every other part of the leader talks to the hosts through this one object (send a command to a host,
broadcast to every member, tell the watchers, record an event), so none of them holds a socket, and
the leader's view of each host (`HostStatus`: its state, progress, and what its disks hold) lives in
one table next to it.

It is also where the leader is fenced (supervisor.leader.election): every command leaves stamped with
the leader's term, and none leaves once the leader cannot be sure it still holds the job's lease.

No connection holds up another: a command is written to its connection and nobody waits for it to
leave, so a broadcast reaches every member as fast as each one reads. A connection that stops taking
its commands (a member whose supervisor stopped reading, a network that stopped carrying) is dropped
once a command has waited `DRAIN_DEADLINE_SECONDS` to leave, or once it holds more than
`MEMBER_BUFFER_LIMIT` bytes: it is aborted, and the leader handles its end as it handles any member's
connection ending, as a lost host.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader.admission import HostState
from slicekeeper.supervisor.leader.relay_link import ChannelTransport, RelayLink

from slicekeeper import protocol

_T = TypeVar("_T")
BUNDLE_MEMBERS = 256
"""Members' own lines one bundle carries at most (a relay's group of 64 in one; a larger group in a
few, each well within the line a relay reads: supervisor.host.relay.FRAME_ROOM)."""
WATCHER_BUFFER_LIMIT = 1 << 20
"""Bytes of status lines a watcher may fall behind by before it is dropped."""

DRAIN_DEADLINE_SECONDS = 5.0
"""Seconds a command written to a connection may wait to leave the leader before the connection is
dropped. A member that reads takes even the largest line (a journal, up to
protocol.CONTROL_LINE_LIMIT) in well under a second on a datacenter network, so only one that
stopped reading waits this long; and it is well within the time a member has to acknowledge a stop
(generations.STOP_ACK_SECONDS), so a member that stopped reading is handled as a lost host (replaced,
the job goes on) before its missing acknowledgement would fail the job."""

MEMBER_BUFFER_LIMIT = 4 * protocol.CONTROL_LINE_LIMIT
"""Bytes of commands a connection may hold unsent before it is dropped, whatever the deadline: four of
the largest lines, more than a member that reads ever holds, so it bounds what the leader keeps for
one that stopped reading while a burst of journals is written to it."""


@dataclass
class HostStatus:
    """What the leader knows of one host."""

    state: HostState = HostState.REGISTERING
    step: int = 0
    loss: float | None = None
    metrics_port: int | None = None
    committed: set[int] = field(default_factory=set)
    """Steps committed in this host's local tier."""
    invalid: set[int] = field(default_factory=set)
    """Steps of this host's shard found corrupt everywhere or whose save failed: never restored."""
    replicas: dict[int, set[int]] = field(default_factory=dict)
    """owner -> steps of the owner's shard this host keeps as peer replicas (reported at stop)."""
    replica_address: str | None = None
    machine: str = ""
    steps_seen: list[tuple[float, int]] = field(default_factory=list)


async def send(writer: asyncio.StreamWriter, message: messages.Message) -> None:
    writer.write(message.encode())
    with contextlib.suppress(OSError):  # ConnectionError, or ssl.SSLError on a cut TLS stream
        await writer.drain()


@dataclass
class _Outbox:
    """What the leader wrote to one connection, and what of it has not been seen leave yet."""

    written: int = 0
    """Bytes written to the connection."""
    gone: int = 0
    """Of those, the bytes seen gone from its buffer at the last look."""
    waiting: deque[tuple[float, int]] = field(default_factory=deque)
    """(when, `written` after it) of each write not yet seen gone, oldest first."""
    look: asyncio.TimerHandle | None = None
    """The next look at the connection, due when the oldest waiting write's deadline passes."""
    dropped: bool = False


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


class Members:
    """The members' connections by host, and the watchers'."""

    def __init__(
        self,
        log_events: bool = False,
        *,
        term: int = 0,
        leading: Callable[[], bool] = lambda: True,
        drain_deadline: float = DRAIN_DEADLINE_SECONDS,
        buffer_limit: int = MEMBER_BUFFER_LIMIT,
    ) -> None:
        self.writers: dict[int, asyncio.StreamWriter] = {}
        self.watchers: list[asyncio.StreamWriter] = []
        self.log_events = log_events
        """Print every event on stderr: in a pod, where no runtime watches, the leader pod's log
        (`kubectl logs <job>-s0-w0`) tells the job's story."""
        self.term = term
        """The leader's term, stamped on every command."""
        self.leading = leading
        """Whether the leader still surely holds the lease; False: nothing is sent (it is fenced)."""
        self.drain_deadline = drain_deadline
        """Seconds a command may wait to leave before its connection is dropped."""
        self.buffer_limit = buffer_limit
        """Bytes a connection may hold unsent before it is dropped."""
        self._served: weakref.WeakKeyDictionary[asyncio.StreamWriter, set[int]] = weakref.WeakKeyDictionary()
        """connection -> the hosts it was made to serve (`host_of` without a look at every host)."""
        self._outboxes: weakref.WeakKeyDictionary[asyncio.StreamWriter, _Outbox] = weakref.WeakKeyDictionary()
        """Each connection written to, while it is open: a connection's entry goes with it."""

    def _stamped(self, message: messages.Message) -> messages.Message:
        if isinstance(message, messages.Order):
            return message.model_copy(update={"term": self.term})
        return message

    def __contains__(self, host: object) -> bool:
        return host in self.writers

    def live(self) -> set[int]:
        return set(self.writers)

    def host_of(self, writer: asyncio.StreamWriter) -> list[int]:
        """The hosts `writer`'s connection serves (one, but for a moment while a spare takes over)."""
        served = self._served.get(writer)
        if served is None:  # a connection that never served a host (a spare's, a watcher's), or one
            return [host for host, member in self.writers.items() if member is writer]  # set by hand
        return [host for host in served if self.writers.get(host) is writer]

    async def send(self, host: int, message: messages.Message) -> None:
        await self.send_to(self.writers[host], message)

    async def send_to(self, writer: asyncio.StreamWriter, message: messages.Message) -> None:
        """Any command to any connection (a member's, a spare's) goes through here: stamped, fenced,
        and written without waiting for it to leave."""
        if self.leading():
            self._write(writer, self._stamped(message).encode())

    async def send_each(self, hosts: Iterable[int], message: messages.Message) -> None:
        """The same `message` to each of `hosts` that is a member, encoded once (a stop to thousands
        of hosts: one encoding, not one a host)."""
        if not self.leading():
            return
        line = self._stamped(message).encode()
        self._write_each([writer for host in hosts if (writer := self.writers.get(host)) is not None], line)

    async def broadcast(self, message: messages.Message) -> None:
        """`message` to every member, encoded once and written to each in turn without waiting for
        any: a member that reads slowly, or not at all, holds up no other."""
        if not self.leading():
            return
        line = self._stamped(message).encode()
        self._write_each(list(self.writers.values()), line)

    async def send_own(self, common: dict[str, Any], each: dict[int, dict[str, Any]]) -> None:
        """A command of its own to each host of `each` that is a member: the fields every one shares
        (`common`, as JSON, stamped with the term here) with the host's own over them. Behind a relay
        one frame carries its members' (a bundle, supervisor.relay_frames), which the relay makes
        into each one's line: a start of 25,000 hosts encodes the world once, not 25,000 times."""
        if not self.leading():
            return
        common = {"term": self.term, **common}
        served = [(writer, each[host]) for host in each if (writer := self.writers.get(host)) is not None]
        direct, relayed = self._by_relay(served)
        for writer, own in direct:
            self._write(writer, protocol.encode(common | own))
        for link, live in relayed.items():
            for first in range(0, len(live), BUNDLE_MEMBERS):
                part = live[first : first + BUNDLE_MEMBERS]
                written = link.write_bundle(
                    [transport.channel for _, transport, _ in part], common, [own for _, _, own in part]
                )
                for writer, transport, _ in part:
                    transport.sent(written)
                    self._track(writer, written[1] // len(part))

    def _write_each(self, writers: list[asyncio.StreamWriter], line: bytes) -> None:
        """`line` to each of `writers`; to the members behind one relay in one frame for them all
        (supervisor.relay_frames), the relay handing it to each: a stop to 25,000 hosts behind 391
        relays is 391 writes, not 25,000."""
        direct, relayed = self._by_relay([(writer, None) for writer in writers])
        for writer, _ in direct:
            self._write(writer, line)
        for link, live in relayed.items():
            written = link.write([transport.channel for _, transport, _ in live], line)
            for writer, transport, _ in live:
                transport.sent(written)
                self._track(writer, len(line))

    def _by_relay(
        self, items: list[tuple[asyncio.StreamWriter, _T]]
    ) -> tuple[
        list[tuple[asyncio.StreamWriter, _T]],
        dict[RelayLink, list[tuple[asyncio.StreamWriter, ChannelTransport, _T]]],
    ]:
        """`items` (a connection and what is for it) as those of connections made directly, and those
        of members behind each relay, still open there."""
        direct: list[tuple[asyncio.StreamWriter, _T]] = []
        relayed: dict[RelayLink, list[tuple[asyncio.StreamWriter, ChannelTransport, _T]]] = {}
        for writer, item in items:
            transport = writer.transport
            if not isinstance(transport, ChannelTransport):
                direct.append((writer, item))
            elif not transport.is_closing() and not self._outbox(writer).dropped:
                relayed.setdefault(transport.link, []).append((writer, transport, item))
        return direct, relayed

    def _outbox(self, writer: asyncio.StreamWriter) -> _Outbox:
        return self._outboxes.setdefault(writer, _Outbox())

    def _write(self, writer: asyncio.StreamWriter, line: bytes) -> None:
        """Write `line` to `writer`'s connection, and have it dropped if the line does not leave in
        time. Writes to one connection leave in the order they were made."""
        if self._outbox(writer).dropped:
            return  # it is closing: the leader is about to handle its end
        writer.write(line)
        self._track(writer, len(line))

    def _track(self, writer: asyncio.StreamWriter, size: int) -> None:
        """`size` bytes just written to `writer`'s connection: looked at by the drain deadline."""
        outbox = self._outbox(writer)
        outbox.written += size
        outbox.waiting.append((asyncio.get_running_loop().time(), outbox.written))
        if outbox.written - outbox.gone > self.buffer_limit:
            self._look(writer, outbox)  # it may hold more than the limit: see now
        elif outbox.look is None:
            outbox.look = asyncio.get_running_loop().call_later(
                self.drain_deadline, self._look, writer, outbox
            )

    def _look(self, writer: asyncio.StreamWriter, outbox: _Outbox) -> None:
        """See what left `writer`'s connection: drop it if it holds too much or if a write waited
        past the deadline; otherwise look again when the oldest write still waiting is due."""
        if outbox.look is not None:
            outbox.look.cancel()
            outbox.look = None
        # Over TLS this is what the TLS layer holds: what it passed on to the TCP transport below
        # counts as gone, so a stalled connection is seen at its next write, never one too early.
        held = writer.transport.get_write_buffer_size()
        outbox.gone = outbox.written - held
        while outbox.waiting and outbox.waiting[0][1] <= outbox.gone:
            outbox.waiting.popleft()
        if not outbox.waiting:
            return
        now = asyncio.get_running_loop().time()
        if held > self.buffer_limit:
            self._drop_connection(
                writer,
                outbox,
                f"its connection holds {_mib(held)} of commands, over {_mib(self.buffer_limit)}",
            )
        elif outbox.waiting[0][0] + self.drain_deadline <= now:
            self._drop_connection(
                writer,
                outbox,
                f"its connection did not drain {_mib(held)} of commands within {self.drain_deadline:g} s",
            )
        else:
            outbox.look = asyncio.get_running_loop().call_at(
                outbox.waiting[0][0] + self.drain_deadline, self._look, writer, outbox
            )

    def _drop_connection(self, writer: asyncio.StreamWriter, outbox: _Outbox, reason: str) -> None:
        """Abort the connection, unsent bytes and all (closing would wait for them): the leader's
        reader of it ends, and handles it as every connection that ends (a member's: a lost host)."""
        outbox.dropped = True
        outbox.waiting.clear()
        hosts = self.host_of(writer)
        who = f"host {hosts[0]}" if hosts else "a connection that serves no host"
        self._record(f"{who} dropped: {reason}", host=hosts[0] if hosts else None)
        writer.transport.abort()

    def serve(self, host: int, writer: asyncio.StreamWriter) -> None:
        """`writer`'s connection serves `host` from now on (a registration, a spare taking it over)."""
        self.writers[host] = writer
        self._served.setdefault(writer, set()).add(host)

    def drop(self, host: int) -> asyncio.StreamWriter:
        return self.writers.pop(host)

    def notify(self, message: messages.Message) -> None:
        """Watchers never hold the job up: no waiting on them; one that falls far behind is dropped."""
        for writer in list(self.watchers):
            if writer.transport.get_write_buffer_size() > WATCHER_BUFFER_LIMIT:
                self.watchers.remove(writer)
                writer.close()
            else:
                writer.write(message.encode())

    async def event(self, text: str, **fields: Any) -> None:
        """Something the job went through: to the watchers (and, in a pod, the leader's log)."""
        self._record(text, **fields)

    def _record(self, text: str, **fields: Any) -> None:
        now = time.time()
        if self.log_events:
            stamp = time.strftime("%H:%M:%S", time.gmtime(now))
            print(f"[leader {stamp}] {text}", file=sys.stderr, flush=True)
        self.notify(messages.EventNote(t=now, text=text, **fields))

    def close(self) -> None:
        for outbox in self._outboxes.values():
            if outbox.look is not None:
                outbox.look.cancel()
        relays: set[RelayLink] = set()
        for writer in [*self.writers.values(), *self.watchers]:
            if isinstance(writer.transport, ChannelTransport):
                relays.add(writer.transport.link)
            else:
                writer.close()
        for relay in relays:  # one end for its members: each relay keeps theirs for the next leader
            relay.writer.close()
