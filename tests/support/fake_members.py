"""Fake host supervisors for tests that drive a real Leader over TCP on 127.0.0.1.

A `Member` speaks the supervisors' JSON-lines protocol to the leader (register, progress, fault,
checkpoint, ...); `join` connects one per host, `eventually` waits until the leader, in the test's
event loop, has processed what was sent, and `run` runs a test's scenario within a time limit. Used by
the leader's coordination tests (tests/unit/test_leader_coordination.py and the hot-swap, elastic and
cluster-replacement tests next to it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from slicekeeper import protocol

WAIT = 5.0
"""Seconds any single wait may take before the test fails instead of hanging."""


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 3 * WAIT))


def coordinator(generation: int, rank0: int = 0) -> str:
    return f"10.0.0.1:{8476 + generation}"


class Member:
    """One fake host supervisor connected to the leader."""

    def __init__(self, host: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.host = host
        self.reader = reader
        self.writer = writer
        self.journals: list[dict[str, Any]] = []
        """Journals the leader wrote down on this member, in order."""
        self.terms: list[int | None] = []
        """The term stamped on each line the leader sent."""

    async def send(self, message_type: str, **fields: Any) -> None:
        self.writer.write(protocol.encode({"type": message_type, "host": self.host, **fields}))
        await self.writer.drain()

    async def receive(self) -> dict[str, Any]:
        """The next command from the leader. The journals it writes down on members before its commands
        are kept in `journals`, not returned, and the leader's term stamped on each (fencing) in
        `terms`: most tests are about the commands."""
        while True:
            line = await asyncio.wait_for(self.reader.readline(), WAIT)
            assert line, f"host {self.host}: the leader closed the connection"
            message = protocol.decode(line)
            self.terms.append(message.pop("term", None))
            if message["type"] != "journal":
                return message
            self.journals.append(message)

    async def fault(self, generation: int, kind: str = "crash", t: float = 100.0) -> None:
        await self.send("fault", generation=generation, kind=kind, detail="workload exited with 1", t=t)

    async def progress(self, generation: int, step: int, t: float) -> None:
        await self.send("progress", generation=generation, step=step, loss=1.0, t=t)

    def close(self) -> None:
        self.writer.close()


async def eventually(predicate: Callable[[], bool]) -> None:
    """Wait until the leader (in this event loop) has processed what the test sent."""
    async with asyncio.timeout(WAIT):
        while not predicate():
            await asyncio.sleep(0.005)


async def join(port: int, hosts: int) -> list[Member]:
    members = []
    for host in range(hosts):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=protocol.CONTROL_LINE_LIMIT)
        members.append(Member(host, reader, writer))
    return members
