"""The leader's side of its connections: who is connected as which host, and how to reach them.

Every other part of the leader talks to the hosts through this one object (send a command to a host,
broadcast to every member, tell the watchers, record an event), so none of them holds a socket, and
the leader's view of each host (`HostStatus`: its state, progress, and what its disks hold) lives in
one table next to it.

It is also where the leader is fenced (supervisor.leader.election): every command leaves stamped with
the leader's term, and none leaves once the leader cannot be sure it still holds the job's lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slicekeeper.supervisor import messages

WATCHER_BUFFER_LIMIT = 1 << 20
"""Bytes of status lines a watcher may fall behind by before it is dropped."""


@dataclass
class HostStatus:
    """What the leader knows of one host."""

    state: str = "registering"
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


class Members:
    """The members' connections by host, and the watchers'."""

    def __init__(
        self, log_events: bool = False, *, term: int = 0, leading: Callable[[], bool] = lambda: True
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

    def _stamped(self, message: messages.Message) -> messages.Message:
        if isinstance(message, messages.Order):
            return message.model_copy(update={"term": self.term})
        return message

    def __contains__(self, host: object) -> bool:
        return host in self.writers

    def live(self) -> set[int]:
        return set(self.writers)

    def host_of(self, writer: asyncio.StreamWriter) -> list[int]:
        return [host for host, member in self.writers.items() if member is writer]

    async def send(self, host: int, message: messages.Message) -> None:
        await self.send_to(self.writers[host], message)

    async def send_to(self, writer: asyncio.StreamWriter, message: messages.Message) -> None:
        """Any command to any connection (a member's, a spare's) goes through here: stamped, fenced."""
        if self.leading():
            await send(writer, self._stamped(message))

    async def broadcast(self, message: messages.Message) -> None:
        if not self.leading():
            return
        stamped = self._stamped(message)
        for writer in list(self.writers.values()):
            await send(writer, stamped)

    def serve(self, host: int, writer: asyncio.StreamWriter) -> None:
        """`writer`'s connection serves `host` from now on (a registration, a spare taking it over)."""
        self.writers[host] = writer

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
        now = time.time()
        if self.log_events:
            stamp = time.strftime("%H:%M:%S", time.gmtime(now))
            print(f"[leader {stamp}] {text}", file=sys.stderr, flush=True)
        self.notify(messages.EventNote(t=now, text=text, **fields))

    def close(self) -> None:
        for writer in [*self.writers.values(), *self.watchers]:
            writer.close()
