"""The leader this supervisor runs while it holds the job's lease, one per term.

When the election makes this supervisor the leader (supervisor.host.leadership), the term's leader
is made (supervisor.host.leadership.LeaderDuties.new_leader), served on this supervisor's leader
address (the socket reserved at start-up for its first term), and, if someone led before, takes the
job over from them with the newest journal this host holds. When it stands down it is given up: the
next term, if this supervisor wins one, gets a new leader.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader import Leader
from slicekeeper.supervisor.leader.election import Holder, Lease
from slicekeeper.supervisor.tls import JobTls

NewLeader = Callable[[int, Callable[[], bool]], Leader]
"""Makes this supervisor's leader for a term, given the check that it still holds the lease."""


class OwnLeader:
    """This supervisor's leader of the current term, if it leads: made, served and taking over."""

    def __init__(
        self,
        new_leader: NewLeader,
        *,
        journal: Callable[[], messages.Journal | None],
        bind: str,
        reserved: socket.socket | None,
        tls: JobTls | None,
        say: Callable[[str], None],
    ) -> None:
        """`journal`: the newest journal this host holds, which a leader taking over carries on;
        `bind`: the address the leader's server listens on; `reserved`: the socket bound to this
        supervisor's leader address at start-up, listened on when it is first elected (None: bound
        then, on the address's port); `tls`: the job's credentials, which the leader's server
        requires of every member."""
        self._new_leader = new_leader
        self._journal = journal
        self._bind = bind
        self._reserved = reserved
        self.tls = tls
        self._say = say
        self.leader: Leader | None = None
        """The term's leader, while this supervisor leads."""

    async def lead(self, term: int, leading: Callable[[], bool], own: Holder, before: Lease | None) -> Leader:
        """This supervisor, `own`, holds the lease in `term` (`leading`: whether it still does),
        taken from the holder of `before`: its leader serves, and takes over if someone led before."""
        leader = self._new_leader(term, leading)
        port = own.address.rsplit(":", 1)[1]
        reserved, self._reserved = self._reserved, None
        await leader.serve(self._bind, int(port), sock=reserved, tls=self.tls, own_host=own.host)
        self.leader = leader
        previous = before.holder if before is not None else None
        if previous != own and (previous is not None or term > 1):
            # Someone led before (a record unreadable as a holder still counted a term): take over.
            whom = f"{previous.machine} (host {previous.host})" if previous else "an unknown holder"
            self._say(f"elected leader (term {term}) in place of {whom}")
            lost_at = before.renewed_at if before else time.time()
            leader.take_over(previous, own, self._journal(), lost_at)
        return leader

    def vacate(self) -> Leader:
        """This supervisor stands down: its leader, which it holds no more."""
        leader, self.leader = self.leader, None
        assert leader is not None
        return leader
