"""A leader elected in place of a lost one: what it gathers before it acts, and how it carries on.

For a moment (`settle`) it only gathers: members reconnecting register again with the newest journal
each holds and the generation it is in, spares offer themselves again, and every other message is
kept, in order. Once every active host but the old leader's is back and nobody arrived for
`QUIET_SECONDS` (at once when the old leader's host is back too, its supervisor restarted), or
`SECONDS` passed with nobody arriving for `ARRIVING_SECONDS` (thousands of members reconnecting at
once on a busy machine are still arriving then: cut short, the last of them would be taken for lost),
or at the latest `LONGEST_SECONDS`, it carries on the newest journal (`carry_on_and_recover`), notes
the change of leader in the job's memory, takes the registrations, stops again a restart that was
under way, treats every active host not back (the old leader's) as lost, and only then reads the
other messages kept: the other hosts' workloads failed because of the lost one, and the restart is
put down to it, not to them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader.admission import HostState
from slicekeeper.supervisor.leader.context import LeaderContext
from slicekeeper.supervisor.leader.election import Holder
from slicekeeper.supervisor.leader.restart_events import TookOver
from slicekeeper.supervisor.leader.restart_state import RestartState

from slicekeeper.policy.events import FaultKind

SECONDS = 5.0
"""This long gathering, and longer while members are still arriving: a member not back by then is
taken for lost."""
ARRIVING_SECONDS = 1.0
"""After `SECONDS`, gathering goes on while the last arrival is more recent than this."""
LONGEST_SECONDS = 30.0
"""At most this long gathering, however many keep arriving."""
QUIET_SECONDS = 0.5
"""Once every expected host is back, this long without a new arrival (spares, late members)."""

Handle = Callable[[messages.ToLeader, asyncio.StreamWriter], Awaitable[None]]


class Takeover:
    def __init__(
        self,
        previous: Holder | None,
        own: Holder,
        journal: messages.Journal | None,
        lost_at: float,
        *,
        context: LeaderContext,
        carry_on: Callable[[dict[str, Any]], None],
        handle: Handle,
        host_lost: Callable[[int, str], Awaitable[None]],
        restart: Callable[[TookOver], Awaitable[RestartState]],
    ) -> None:
        self.previous = previous
        self.own = own
        self.lost_at = lost_at
        """When the old leader's lease was last seen renewed (Unix seconds)."""
        self.began = self.last_arrival = time.monotonic()
        self.journals = [journal] if journal is not None else []
        self.backlog: list[tuple[messages.ToLeader, asyncio.StreamWriter]] = []
        self.hosts: set[int] = set()
        self.heard_another = False
        """A machine other than this leader's own registered: a leader that heard none is cut off
        (supervisor.leader.silence), or elected after the job ended, and must not act."""
        self.context = context
        self._carry_on = carry_on
        self._handle = handle
        self._host_lost = host_lost
        self._restart = restart
        """The restart machine's driver (`Generations.send`)."""

    # --- gathering ----------------------------------------------------------------------------
    def gather(self, message: messages.ToLeader, writer: asyncio.StreamWriter) -> None:
        self.backlog.append((message, writer))
        if isinstance(message, (messages.Register, messages.RegisterSpare)):
            self.last_arrival = time.monotonic()
            self.heard_another |= isinstance(message, messages.RegisterSpare) or message.host != self.own.host
        if isinstance(message, messages.Register):
            self.hosts.add(message.host)
            if message.journal is not None:
                self.journals.append(message.journal)

    def newest(self) -> messages.Journal | None:
        return max(self.journals, key=lambda journal: journal.seq, default=None)

    def settled(self) -> bool:
        now = time.monotonic()
        gathering, quiet = now - self.began, now - self.last_arrival
        if gathering >= LONGEST_SECONDS or (gathering >= SECONDS and quiet >= ARRIVING_SECONDS):
            return True
        newest = self.newest()
        if newest is not None:  # the hosts of the slices active when that journal was written
            hosts = {
                h for s in newest.journal["world"]["active"] for h in self.context.world.hosts_of(int(s))
            }
        else:
            hosts = set(self.context.world.hosts)
        if hosts <= self.hosts:
            return True  # every host is back, the old leader's too (its supervisor restarted)
        expected = hosts - ({self.previous.host} if self.previous else set())
        return expected <= self.hosts and quiet >= QUIET_SECONDS

    async def settle(self) -> None:
        while not self.settled():
            await asyncio.sleep(0.1)

    # --- carrying on --------------------------------------------------------------------------
    async def carry_on_and_recover(self) -> None:
        best = self.newest()
        if best is None:
            # Nobody holds a journal: the lease outlived a job that is starting anew (e.g. resumed
            # after a suspension, its pods all gone). Nothing to carry on: a first start.
            for message, writer in self.backlog:
                await self._handle(message, writer)
            return
        self._carry_on(best.journal)
        self.context.journal.seq = best.seq
        await self._note_change()
        joins = (messages.Register, messages.RegisterSpare)
        # The furthest step any member completed, before a registration stops the job on it.
        steps = [m.step for m, _ in self.backlog if isinstance(m, messages.Register) and m.step is not None]
        self.context.memory.high_water = max([self.context.memory.high_water, *steps])
        # Members coming back first, each into its place, then new machines (a replacement pod, a
        # restarted supervisor) and spares: a newcomer stops the job, and the decision on it must
        # see every member that is back, not only those registered before it.
        registrations = [(m, w) for m, w in self.backlog if isinstance(m, joins)]
        registrations.sort(key=lambda join: not _coming_back(join[0]))  # stable: arrival order kept
        for join, member in registrations:
            await self._handle(join, member)
        # A restart under way when the leader was lost: every member acks (again) with its holdings.
        cause = self.context.memory.stop_cause
        kind = FaultKind(cause["kind"]) if cause is not None else None
        await self._restart(TookOver(kind, tuple(sorted(self.context.members.live()))))
        for host in self.context.world.hosts:
            if host not in self.context.members and self.context.status[host].state != HostState.LOST:
                self.context.status[host].state = HostState.LOST
                await self._host_lost(host, self.context.status[host].machine or f"host-{host}")
        for message, writer in [(m, w) for m, w in self.backlog if not isinstance(m, joins)]:
            await self._handle(message, writer)
        await self.context.journal.write()

    async def _note_change(self) -> None:
        previous = self.previous
        change = {
            "at": time.time(),
            "term": self.context.members.term,
            "from_host": previous.host if previous else None,
            "from_machine": previous.machine if previous else None,
            "to_host": self.own.host,
            "to_machine": self.own.machine,
            "leaderless_seconds": round(time.time() - self.lost_at, 3),
        }
        self.context.memory.leader_changes.append(change)
        await self.context.members.event(
            f"leader change: host {change['from_host']} -> host {change['to_host']} (term {change['term']}), "
            f"{change['leaderless_seconds']:.1f} s without a leader",
            host=self.own.host,
        )


def _coming_back(join: messages.ToLeader) -> bool:
    """A member of the job registering again (with the generation its workload is in)."""
    return isinstance(join, messages.Register) and join.generation is not None
