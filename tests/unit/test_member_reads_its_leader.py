"""How a member reads its leader's connection: a malformed command is logged and ignored, a line over
the limit gives the connection up (the leader is found again), never the member; and a member whose
leader is superseded, or whose leader's connection broke off, still keeps the journals that leader
wrote and it had not read yet (a journal is written before the command it leads to, and the next
leader carries on the newest one its members hold: a hot-swap journaled just before its leader was
killed must not be lost)."""

from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from slicekeeper.supervisor import messages
from slicekeeper.supervisor.host.membership import Membership
from slicekeeper.supervisor.leader_connection import open_control_connection
from slicekeeper.supervisor.tls import JobTls

from slicekeeper import credentials


def member(said: list[str]) -> Membership:
    leadership: Any = None  # reading commands asks nothing of who leads
    return Membership(leadership, SearchFor(1.0, 1), finished=asyncio.Event(), say=said.append)


@dataclass(frozen=True)
class SearchFor:
    """A site's rules for looking for a leader."""

    leader_wait: float
    leader_unreachable_exit_code: int


async def read(
    lines: list[bytes], *, limit: int = 2**16, superseded: bool = False
) -> tuple[list[Any], list[str]]:
    """What a member carries out of `lines` from its leader, and what it says."""
    reader = asyncio.StreamReader(limit=limit)
    for line in lines:
        reader.feed_data(line)
    reader.feed_eof()
    obeyed: list[messages.Command] = []
    said: list[str] = []

    async def obey(command: messages.Command) -> bool:
        obeyed.append(command)
        return False

    membership = member(said)
    if superseded:
        await membership._last_journals(reader, obey)
    else:
        assert await membership._commands(reader, obey) is False  # the connection ended: find the leader
    return obeyed, said


JOURNAL = messages.Journal(seq=7, journal={"memory": {"hot_swaps": [{"host": 2}]}})
STOP = messages.Stop(generation=3, kind="crash")


def test_a_malformed_command_is_logged_and_ignored():
    obeyed, said = asyncio.run(
        read([b'{"type": "start", "generation": "x"}\n', b"not json\n", STOP.encode()])
    )
    assert obeyed == [STOP]
    assert len(said) == 2 and all(s.startswith("ignored a malformed command from the leader") for s in said)


def test_a_line_over_the_limit_gives_the_connection_up():
    obeyed, said = asyncio.run(read([STOP.encode(), b"x" * 5000 + b"\n", STOP.encode()], limit=1024))
    assert obeyed == [STOP]
    assert said and "over the limit" in said[0]


def test_the_unread_journals_of_a_superseded_leader_are_kept_and_its_commands_are_not_obeyed():
    later = messages.Journal(seq=8, base=7, change=[])
    obeyed, _ = asyncio.run(read([JOURNAL.encode(), STOP.encode(), later.encode()], superseded=True))
    assert obeyed == [JOURNAL, later]


@pytest.fixture(params=["tcp", "tls"])
def tls(request: pytest.FixtureRequest, tmp_path: Path) -> JobTls | None:
    """The member's connection in the clear, or with the job's credentials (as in a job)."""
    if request.param == "tcp":
        return None
    return JobTls(credentials.generate("member-reads").write(tmp_path / "credentials"))


async def read_after_a_reset(
    lines: list[bytes], tls: JobTls | None
) -> tuple[list[Any], BaseException | None]:
    """What a member carries out of `lines` its leader sent before the connection broke off (a reset:
    the leader's process gone, the member's report to it refused), read through the connection a
    member opens, once the lines and the reset both arrived; and how the connection ended."""

    async def lead(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"".join(lines))
        await writer.drain()
        lingers_not = struct.pack("ii", 1, 0)  # SO_LINGER 0: the close resets the connection
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, lingers_not)
        writer.transport.abort()

    server = await asyncio.start_server(lead, "127.0.0.1", 0, ssl=tls.server if tls else None)
    async with server:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await open_control_connection("127.0.0.1", port, tls)
        ended: BaseException | None = None
        try:
            await writer.wait_closed()
        except OSError as error:
            ended = error
        obeyed: list[messages.Command] = []

        async def obey(command: messages.Command) -> bool:
            obeyed.append(command)
            return False

        assert await member([])._commands(reader, obey) is False  # the connection ended: find the leader
    return obeyed, ended


def test_the_lines_a_leader_sent_before_its_connection_broke_off_are_still_carried_out(tls):
    """A member busy stopping its workload when its leader is killed finds the connection broken off
    (its report to the dead leader refused): the journals after the stop, which hold the decision and
    the hot-swap, are still its own, and the next leader carries them on."""
    later = messages.Journal(seq=8, base=7, change=[])
    obeyed, ended = asyncio.run(read_after_a_reset([JOURNAL.encode(), STOP.encode(), later.encode()], tls))
    assert isinstance(ended, ConnectionResetError), ended  # broken off, not ended in order
    assert obeyed == [JOURNAL, STOP, later]
