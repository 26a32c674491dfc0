"""How a member reads its leader's connection: a malformed command is logged and ignored, a line over
the limit gives the connection up (the leader is found again), never the member; and a member whose
leader is superseded still keeps the journals that leader wrote and it had not read yet (a journal is
written before the command it leads to, and the next leader carries on the newest one its members
hold: a hot-swap journaled just before its leader was killed must not be lost)."""

from __future__ import annotations

import asyncio
from typing import Any

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.host.membership import Membership


def member(said: list[str]) -> Membership:
    leadership: Any = None  # reading commands asks nothing of who leads
    return Membership(
        leadership, wait=1.0, unreachable_exit_code=lambda: 1, finished=asyncio.Event(), say=said.append
    )


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
