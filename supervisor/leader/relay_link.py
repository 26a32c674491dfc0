"""The leader's side of a relay's connection: each member behind the relay as a connection of its own.

A relay (supervisor.host.relay) carries its group's members' connections over one connection to the
leader (supervisor.relay_frames). Here each of its channels becomes an asyncio stream pair of its
own, over a transport that writes framed lines to the relay's connection, so that the leader serves a
member behind a relay with the very code that serves a member connected to it directly: its
registration, its commands and their drain deadlines (`Members`), its connection's end as a lost
host, its silence at the deadline. The leader holds one socket per relay; nothing else changes.

A channel's end: the relay says its member's connection ended (`-`, or `-silent` at its deadline of
silence), or the leader drops or closes the member's stream (the relay is told, and closes the
member's connection). A relay's loss is one more fault, not its group's: its connection ending
(its host lost, hung, or cut off: then at its deadline of silence) leaves its channels open for
`REJOIN_SECONDS`, while its members, their own connections to it ended, rejoin the leader through
their group's next relay (a rejoining member's registration closes its older channel: leader.
registrations). The channels still open then end as their members' connections would have, as
silent when the relay's went silent (the leader judges that silence as it judges every member's): the
relay's own host among them, unless it came back too.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from slicekeeper.supervisor.relay_frames import (
    BUNDLE,
    END,
    OPEN,
    SILENT,
    Frame,
    FrameError,
    bundle,
    frame,
    parse,
    values_of,
)

from slicekeeper import protocol

REJOIN_SECONDS = 10.0
"""How long a lost relay's members have to rejoin through another relay before each is lost: a member
sees its relay's end at once when the relay's process died, at its connection's deadline of silence
otherwise (5 s by default, as the leader sees the relay's), and reaches the next relay of its group
within a second (supervisor.host.relay.RELAY_ATTEMPT_SECONDS each)."""

ServeMember = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]]
Deliver = Callable[[Any, asyncio.StreamWriter], Awaitable[None]]
"""(one of a member's lines, read already; its stream) -> taken as the leader takes its lines."""


class ChannelTransport(asyncio.Transport):
    """One member's stream to the leader, written as frames on its relay's connection."""

    def __init__(self, link: RelayLink, channel: int, protocol_: asyncio.StreamReaderProtocol) -> None:
        super().__init__()
        self.link = link
        self.channel = channel
        self._protocol = protocol_
        self._closing = False
        self._unsent: deque[tuple[int, int]] = deque()
        """(the relay connection's byte count after it, its size) of each write not seen leave yet."""

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        for line in bytes(data).splitlines(keepends=True):
            self.sent(self.link.write([self.channel], line))

    def sent(self, written: tuple[int, int]) -> None:
        """A frame for this channel was written to the relay's connection: (its bytes after it, its size)."""
        self._unsent.append(written)

    def received(self, line: bytes) -> None:
        """A line the member sent, for the leader's reader of it."""
        self._protocol.data_received(line)

    def get_write_buffer_size(self) -> int:
        """This member's bytes not yet gone from the relay connection's buffer: what `Members` reads
        to see a member fall behind (here: its relay's connection stopped draining)."""
        gone = self.link.gone()
        while self._unsent and self._unsent[0][0] <= gone:
            self._unsent.popleft()
        return sum(size for _, size in self._unsent)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self.abort()

    def abort(self) -> None:
        """The leader drops the member: the relay is told to close its connection, and the leader's
        reader of it ends as a connection's does."""
        if not self._closing:
            self.link.write([self.channel], END)
            self.link.ended(self.channel, None)

    def ending(self, error: Exception | None) -> None:
        """The channel ends (`error` None: cleanly): the reader sees its end once what came before."""
        if not self._closing:
            self._closing = True
            asyncio.get_running_loop().call_soon(self._protocol.connection_lost, error)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "socket":
            return None  # its deadline of silence is the relay's to keep (supervisor.connection_deadline)
        return self.link.writer.get_extra_info(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False


class RelayLink:
    """One relay's connection, serving each of its channels with `serve_member`."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        serve_member: ServeMember,
        rejoin_seconds: float,
        *,
        relay_host: int | None = None,
        host_of: Callable[[asyncio.StreamWriter], list[int]] = lambda writer: [],
        deliver: Deliver | None = None,
    ) -> None:
        """`rejoin_seconds`: how long its members have to rejoin through another relay once its
        connection ended; `relay_host`: the host whose supervisor relays (its member's channel ends
        with the relay's connection at once); `host_of(writer)`: the hosts a channel's stream serves;
        `deliver`: takes a member's line that came gathered with others' (supervisor.host.relay_acks),
        read already (None: each is handed to its member's stream, as if it came alone)."""
        self.reader = reader
        self.writer = writer
        self._serve_member = serve_member
        self.rejoin_seconds = rejoin_seconds
        self._relay_host = relay_host
        self._host_of = host_of
        self._deliver = deliver
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._emptied = asyncio.Event()
        self._channels: dict[int, ChannelTransport] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._written = 0
        """Bytes written to the relay's connection."""
        self._unflushed: list[bytes] = []
        """Frames written in this turn of the event loop, to leave together at its end (`_flush`)."""
        self._unflushed_bytes = 0

    def write(self, channels: list[int], line: bytes) -> tuple[int, int]:
        """`line` to `channels` (one frame); (bytes written after it, its size). The frames written in
        one turn of the event loop leave together, in one write to the connection (a start of every
        host behind the relay: one TLS record and one send, not one a host)."""
        return self._queue(frame(channels, line))

    def write_bundle(
        self, channels: list[int], common: dict[str, Any], each: list[dict[str, Any]]
    ) -> tuple[int, int]:
        """A line of its own to each of `channels` (`common` with `each[i]` over it), in one frame
        that the relay makes into each member's line; (bytes written after it, its size)."""
        return self._queue(bundle(channels, common, each))

    def _queue(self, data: bytes) -> tuple[int, int]:
        if not self._unflushed:
            asyncio.get_running_loop().call_soon(self._flush)
        self._unflushed.append(data)
        self._unflushed_bytes += len(data)
        self._written += len(data)
        return self._written, len(data)

    def _flush(self) -> None:
        data, self._unflushed, self._unflushed_bytes = b"".join(self._unflushed), [], 0
        if data and not self.writer.transport.is_closing():
            self.writer.write(data)

    def gone(self) -> int:
        """Bytes of the relay's connection that left its buffer."""
        return self._written - self._unflushed_bytes - self.writer.transport.get_write_buffer_size()

    def ended(self, channel: int, error: Exception | None) -> None:
        transport = self._channels.pop(channel, None)
        self._writers.pop(channel, None)
        if transport is not None:
            transport.ending(error)
        if not self._channels:
            self._emptied.set()

    async def run(self) -> None:
        """Serve the relay's channels until its connection ends; then, once its members had their
        time to rejoin through another relay, end every channel still open, and return once the
        leader handled each member's end."""
        error: Exception | None = None
        ending = False
        try:
            while line := await self.reader.readline():
                if not line.endswith(b"\n"):
                    break  # cut short by the connection's end
                try:
                    received = parse(line)
                except FrameError as bad:
                    print(f"leader: ignored a malformed relay frame: {bad}", file=sys.stderr, flush=True)
                    continue
                if received.payload.startswith(BUNDLE):
                    await self._take_gathered(received)
                    continue
                for channel in received.channels:
                    self._received(channel, received.payload)
        except TimeoutError as silent:  # the relay's deadline of silence: its members fell silent too
            error = silent
        except (OSError, ValueError):  # reset, a cut TLS stream; a line over the limit
            pass
        except asyncio.CancelledError:  # the leader's process is ending: no member is lost for it
            ending = True
        finally:
            lost = TimeoutError() if error is not None else None
            for channel, writer in list(self._writers.items()):
                if self._relay_host is not None and self._relay_host in self._host_of(writer):
                    self.ended(channel, lost)  # the relay's own host went with it
            if self._channels and not ending:
                self._emptied.clear()
                with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                    await asyncio.wait_for(self._emptied.wait(), self.rejoin_seconds)
            for channel in list(self._channels):
                self.ended(channel, lost)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _take_gathered(self, received: Frame) -> None:
        """Several members' lines in one frame (their acknowledgements of a stop), each taken as its
        member's, after whatever its member sent before it (read already, its turn comes first)."""
        try:
            values = values_of(received)
        except FrameError as bad:
            print(f"leader: ignored a malformed relay bundle: {bad}", file=sys.stderr, flush=True)
            return
        await asyncio.sleep(0)  # the members' earlier lines, handed to their streams, are taken first
        for channel, value in values:
            writer, transport = self._writers.get(channel), self._channels.get(channel)
            if writer is None or transport is None:
                continue  # its member gone meanwhile
            if self._deliver is None:
                transport.received(protocol.encode(value))
            else:
                await self._deliver(value, writer)

    def _received(self, channel: int, payload: bytes) -> None:
        if payload == OPEN:
            self._open(channel)
        elif payload == END:
            self.ended(channel, None)
        elif payload == SILENT:
            self.ended(channel, TimeoutError())
        elif (transport := self._channels.get(channel)) is not None:
            transport.received(payload)

    def _open(self, channel: int) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=protocol.CONTROL_LINE_LIMIT, loop=loop)
        stream = asyncio.StreamReaderProtocol(reader, loop=loop)
        transport = ChannelTransport(self, channel, stream)
        stream.connection_made(transport)
        self.ended(channel, None)  # a channel opened again: its earlier member is gone
        self._channels[channel] = transport
        writer = asyncio.StreamWriter(transport, stream, reader, loop)
        self._writers[channel] = writer
        task = asyncio.create_task(self._serve_member(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
