"""Whether a leader lost a member, or is itself cut off: a silent connection's end, judged by the rest.

A member's connection that ends at its deadline (supervisor.connection_deadline: nothing, not even a
keepalive probe, got through) means one of two things. Either that member is cut off, and its host
is lost: it is replaced and the job goes on. Or the leader is cut off from everyone, by a partition
around its own host that may still let it reach the API server, so that it keeps the job's lease: then
every host it treats as lost would be a wrong decision, and the job would wait on a leader nobody
reaches. One connection cannot tell them apart; the others can. A silent end is judged `grace`
seconds later (the other connections of a leader cut off end within about a probe interval of each
other, or a few retransmissions where a command was on its way): if a member other than the leader's
own host still has a live connection, the member is lost; if none has, the leader is cut off and
stands down, and its supervisor gives up the lease for a leader the others reach
(supervisor.host.leadership). The leader's own host is not counted: its connection never leaves the
machine, so a partition does not cut it (locally, where every host shares one loopback, it does).

Telling one side from the other takes a third host: in a job of two, a silent member and a leader
cut off look the same, and the leader stands down.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

SILENCE_GRACE_SECONDS = 2.0
"""The least time a silent end is judged after (more for long deadlines: half the deadline)."""


def grace_for(deadline: float) -> float:
    return max(SILENCE_GRACE_SECONDS, deadline / 2)


class Silence:
    def __init__(self, deadline: float) -> None:
        self.grace = grace_for(deadline)
        self.deadline = deadline
        self.own_host: int | None = None
        """The host whose supervisor runs the leader: its connection is not counted."""
        self._silent: set[Any] = set()
        self.cut_off = False
        """Every member went silent: this leader is the one cut off."""

    async def cut_off_after(self, connection: Any, members: Callable[[], Iterable[tuple[int, Any]]]) -> bool:
        """`connection` ended silently: True once the leader is found cut off, False when `members`
        (host, connection) still include one of another host than its own that did not go silent
        within the grace."""
        self._silent.add(connection)
        try:
            await asyncio.sleep(self.grace)
            talking = [h for h, other in members() if other not in self._silent and h != self.own_host]
            if not talking:
                self.cut_off = True
            return self.cut_off
        finally:
            self._silent.discard(connection)

    def reason(self) -> str:
        return (
            f"heard no member for {self.deadline:g} s (their connections' deadline) and "
            f"{self.grace:g} s more: this leader is the one cut off"
        )
