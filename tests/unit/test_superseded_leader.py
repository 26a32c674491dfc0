"""A member whose leader is superseded still keeps the journals that leader wrote and it had not read
yet: a journal is written before the command it leads to, and the next leader carries on the newest
one its members hold (a hot-swap journaled just before its leader was killed must not be lost)."""

from __future__ import annotations

import asyncio

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.host.membership import Membership


def test_the_unread_journals_of_a_superseded_leader_are_kept_and_its_commands_are_not_obeyed():
    async def main() -> list[messages.Command]:
        reader = asyncio.StreamReader()
        for message in (
            messages.Journal(seq=7, journal={"memory": {"hot_swaps": [{"host": 2}]}}),
            messages.Stop(generation=3, kind="crash"),
            messages.Journal(seq=8, base=7, change=[]),
        ):
            reader.feed_data(message.encode())
        obeyed: list[messages.Command] = []

        async def obey(command: messages.Command) -> bool:
            obeyed.append(command)
            return False

        membership = Membership.__new__(Membership)  # only its reading of the last lines is used
        await membership._last_journals(reader, obey)
        return obeyed

    obeyed = asyncio.run(main())
    assert [(type(m).__name__, m.seq) for m in obeyed] == [("Journal", 7), ("Journal", 8)]  # type: ignore[union-attr]
