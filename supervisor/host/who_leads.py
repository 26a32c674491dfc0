"""Who leads the job, asked of the few supervisors that read its lease.

Every supervisor reading the job's Lease makes the job's cost to the API server grow with its size
(issue 41: a 25,000-host job would read it 12,500 times a second at rest). With relays
(spec.controlPlane.relays) only `leaseCandidates` supervisors read and write the Lease
(slicekeeper.shape.JobShape.lease_candidates); any other, spares included, asks them, at its start
and while its member looks for a leader, on their relay ports: a WhoLeads line, answered with the
lease as that candidate last read it (messages.LeaseSeen). The candidates are asked together and the
newest term named is taken: one of them may lag, or be cut off. When none answers, the supervisor
reads the lease itself (supervisor.host.leadership): the job never waits on its candidates.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader.election import Lease
from slicekeeper.supervisor.leader_connection import ATTEMPT_SECONDS, open_control_connection
from slicekeeper.supervisor.tls import JobTls

ASK_SECONDS = 1.0
"""How long a candidate has to answer: on the job's own network it answers in milliseconds."""

UNANSWERED_SECONDS = 5.0
"""How long a supervisor that is not a lease candidate asks the candidates in vain before it reads the
lease itself: long enough for a candidate starting with the job, short against a leader's wait for
its members (LEADER_WAIT_SECONDS in a pod)."""

AskCandidates = Callable[[], Awaitable[tuple[bool, Lease | None]]]
"""Asks the lease's candidates who leads: (whether any answered, the newest lease they name)."""


class AskingCandidates:
    """How a supervisor that is not a lease candidate learns the lease: it asks the candidates
    (`ask`), and reads the lease itself (`read`) once none answered for UNANSWERED_SECONDS."""

    def __init__(
        self,
        ask: AskCandidates,
        read: Callable[[], Awaitable[Lease | None]],
        say: Callable[[str], None],
    ) -> None:
        self._ask = ask
        self._read = read
        self._say = say
        self._unanswered_since: float | None = None
        """Monotonic time since which no candidate answered (None: one did last time)."""
        self._reading = False
        """None answered for UNANSWERED_SECONDS: the lease is read (said once)."""

    async def learn(self) -> tuple[bool, Lease | None]:
        """(whether a candidate answered, the lease it named or the one read; None: none known yet,
        and asked again next time)."""
        try:
            answered, lease = await self._ask()
        except Exception as error:  # a malformed answer: as if none came
            self._say(f"cannot ask the lease's candidates who leads: {error!r}")
            answered, lease = False, None
        if answered:
            self._unanswered_since, self._reading = None, False
            return True, lease
        now = time.monotonic()
        if self._unanswered_since is None:
            self._unanswered_since = now
        if now - self._unanswered_since < UNANSWERED_SECONDS:
            return False, None  # a candidate still starting, or being replaced: ask again
        if not self._reading:
            self._say(f"no lease candidate answered for {UNANSWERED_SECONDS:.0f} s: reading the lease")
        self._reading = True
        return False, await self._read()


def seen(lease: Lease | None) -> messages.LeaseSeen:
    """The answer to a WhoLeads from a supervisor that last saw `lease` (None: none read yet)."""
    if lease is None:
        return messages.LeaseSeen()
    return messages.LeaseSeen(holder=lease.identity(), term=lease.term, renewed_at=lease.renewed_at)


async def ask(relay: str, tls: JobTls | None) -> Lease | None:
    """The lease as the supervisor serving the relay port `relay` ("host:port") last saw it (None:
    it has read none yet). OSError, TimeoutError, ValueError: no answer."""
    host, _, port = relay.rpartition(":")
    reader, writer = await asyncio.wait_for(open_control_connection(host, int(port), tls), ATTEMPT_SECONDS)
    try:
        writer.write(messages.WhoLeads().encode())
        answer = messages.lease_seen(await asyncio.wait_for(reader.readline(), ASK_SECONDS))
    finally:
        writer.close()
    if answer.holder is None:
        return None
    return Lease.of(answer.holder, answer.term, answer.renewed_at)


async def ask_candidates(candidates: list[str], tls: JobTls | None) -> tuple[bool, Lease | None]:
    """Asks every one of `candidates` (relay addresses) at once: whether any answered, and the
    lease of the newest term named (None: none names one yet)."""
    answers = await asyncio.gather(*(ask(c, tls) for c in candidates), return_exceptions=True)
    answered = [a for a in answers if not isinstance(a, BaseException)]
    leases = [a for a in answered if a is not None]
    return bool(answered), max(leases, key=lambda lease: lease.term, default=None)
