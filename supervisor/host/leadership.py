"""This host's part in who leads the job: campaigning for the lease, leading while it holds it, and
knowing which leader to follow.

Every host's supervisor is a candidate (supervisor.leader.election); a spare only watches the lease
until it takes a host over (`adopt`). With relays only a few hosts' supervisors are
(spec.controlPlane.leaseCandidates): any other supervisor, spares included, asks them who leads at its
start and while its member looks for a leader (supervisor.host.who_leads), and reads the lease itself
only when none of them answers, so that the job's requests to the API server do not grow with it.
At the start the first host (host 0) takes the lease and the others wait for it to exist, so a job
starts with the leader it always had. Afterwards whoever sees
the lease unrenewed for its duration, or released, takes it: the new leader serves on this
supervisor's leader address and takes over from the old one (supervisor.leader.Leader.take_over). A
leader that cannot renew in time stands down and closes its server, so its members go looking for
the new one.

`Leadership` decides when this supervisor leads, over two parts: the lease as last seen, which says
whom to follow (`ObservedLease`), and the leader it runs while it leads (host.own_leader.OwnLeader).
`LeaderDuties` says with what it leads. The leader of a term is built from the job's plan (restart
limits, policy engine, persistent tier, the site's coordinator addresses and replacement timeout) so
that every candidate builds the same one; while it leads, the job's status is published to watchers
and, in a pod, on the pod itself (with this host's goodput), where the operator reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import Any

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTier
from slicekeeper.supervisor.host.own_leader import NewLeader, OwnLeader
from slicekeeper.supervisor.host.site import PodAnnotations, Site
from slicekeeper.supervisor.host.who_leads import AskCandidates, AskingCandidates
from slicekeeper.supervisor.leader import Leader
from slicekeeper.supervisor.leader.election import Election, Holder, Lease
from slicekeeper.supervisor.leader.settings import LeaderSettings
from slicekeeper.supervisor.plan import JobPlan
from slicekeeper.supervisor.tls import JobTls

from slicekeeper.leader_view import LeaderView
from slicekeeper.policy.engine import PolicyEngine
from slicekeeper.shape import JobLayout

WATCH_SECONDS = 0.2
"""How often a spare (which only watches) reads the lease, and a candidate before the lease exists
or while its member looks for a new leader (`looking`)."""

LAST_BROADCAST_SECONDS = 0.2
"""At the job's end, how long the leader lets its last broadcast reach members and watchers."""


class ObservedLease:
    """The job's lease as this supervisor last saw it: which leader to follow, and the wait for a
    newer one."""

    def __init__(self) -> None:
        self.lease: Lease | None = None
        self._changed = asyncio.Event()

    def seen(self, lease: Lease | None) -> None:
        """`lease` was read (None: nothing was): a new holder or term wakes whoever waits for one."""
        if lease is None:
            return
        if self.lease is None or (lease.leader, lease.term) != (self.lease.leader, self.lease.term):
            self.lease = lease
            self._changed.set()

    async def current(self, *, newer_than: int = 0, timeout: float | None = None) -> Lease | None:
        """The lease once a holder of a term above `newer_than` is seen (None: not within `timeout`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            lease = self.lease
            if lease is not None and lease.leader is not None and lease.term > newer_than:
                return lease
            self._changed.clear()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)


class Leadership:
    def __init__(
        self,
        election: Election,
        own: Holder,
        *,
        candidate: bool,
        first: bool,
        successor: bool = False,
        new_leader: NewLeader,
        journal: Callable[[], messages.Journal | None],
        bind: str,
        reserved: socket.socket | None = None,
        tls: JobTls | None = None,
        ask: AskCandidates | None = None,
        say: Callable[[str], None] = lambda text: print(text, file=sys.stderr, flush=True),
    ) -> None:
        """`tls`: the job's credentials, which the leader's server requires of every member;
        `new_leader`, `journal`, `bind`, `reserved`: as supervisor.host.own_leader.OwnLeader takes
        them; `ask`: where only a few candidates read the lease, how a supervisor that is not one of
        them learns it (None: it reads the lease itself)."""
        self.election = election
        self.own = own
        self.candidate = candidate
        """A host's supervisor may lead; a spare only watches."""
        self.first = first
        """The job's first leader: takes the lease at once (the others wait for it to exist)."""
        self.successor = successor
        """This supervisor was started again on its machine: a lease its dead predecessor still
        holds is released at once instead of waiting out its duration."""
        self._say = say
        self._asking = None if ask is None else AskingCandidates(ask, self._read, say)
        """Where only a few candidates read the lease: how this supervisor learns it otherwise."""
        self._earlier_requests = 0
        """Lease requests of the elections this supervisor took part in before its current one."""
        self._own_leader = OwnLeader(
            new_leader, journal=journal, bind=bind, reserved=reserved, tls=tls, say=say
        )
        self._observed = ObservedLease()
        self.looking = False
        """This host's member lost its leader and looks for the next: the lease is read more often."""
        self.cut_off = False
        """It led, and heard no member: it does not campaign until its member reaches a leader."""
        self.elected: Callable[[Leader], None] = lambda leader: None
        """Called when this supervisor starts leading (its status publishing starts with it)."""
        self.deposed: Callable[[], None] = lambda: None
        """Called when it stops leading (its status publishing stops)."""

    @property
    def leader(self) -> Leader | None:
        """This supervisor's leader, while it leads."""
        return self._own_leader.leader

    @property
    def tls(self) -> JobTls | None:
        """The job's credentials (None: connections without TLS, in tests and benchmarks)."""
        return self._own_leader.tls

    @property
    def lease(self) -> Lease | None:
        """The lease as last seen: whom to follow."""
        return self._observed.lease

    async def current(self, *, newer_than: int = 0, timeout: float | None = None) -> Lease | None:
        """The lease once a holder of a term above `newer_than` is seen (None: not within `timeout`)."""
        return await self._observed.current(newer_than=newer_than, timeout=timeout)

    async def superseded(self, term: int, address: str | None = None) -> Lease:
        """Returns once a leader of a newer term than `term` is seen elsewhere than at `address`. A
        newer leader at `address` itself is the one a member connected there is reading already (a
        connection cannot outlive the process it was made to: e.g. a restarted supervisor serving
        again on its predecessor's address)."""
        while True:
            lease = await self.current(newer_than=term)
            assert lease is not None and lease.leader is not None
            if lease.leader.address != address:
                return lease
            term = lease.term

    async def run(self) -> None:
        """Campaign (or watch) for as long as the supervisor runs."""
        retry = self.election.timing.retry
        if not self.first:
            # Only the first host creates the lease: were host 0's pod late, a member leading in its
            # place would wait for it all the same; instead members that find no leader in time ask
            # for new pods (supervisor/leader_connection.py).
            while await self._learn() is None:
                await asyncio.sleep(WATCH_SECONDS)
        if self.successor:
            await self._release_predecessor()
        while True:
            if self.candidate and not self.cut_off:
                await self._campaign()
                await asyncio.sleep(retry if self.lease is not None and not self.looking else WATCH_SECONDS)
            elif self.candidate or self._asking is None:
                await self._read()  # a spare: offered to a new leader before it decides what to do
                await asyncio.sleep(WATCH_SECONDS)
            else:
                if self.looking or self.lease is None:  # at rest its member follows its leader
                    await self._learn()
                await asyncio.sleep(WATCH_SECONDS)

    async def _release_predecessor(self) -> None:
        try:
            released = await self.election.release_predecessor(self.own)
        except Exception as error:  # the lease expires anyway
            self._say(f"cannot release the lease of this machine's previous supervisor: {error!r}")
            return
        if released is not None:
            self._say(f"released the lease (term {released.term}) of this machine's previous supervisor")

    async def _learn(self) -> Lease | None:
        """The lease: read by a candidate (or where every supervisor reads it); asked of the
        candidates by any other supervisor, and read only when none of them answers (a newer term
        than one seen already, or the same, is taken: a candidate's reading may lag another's)."""
        if self.candidate or self._asking is None:
            return await self._read()
        answered, lease = await self._asking.learn()
        seen = self.lease
        if answered and lease is not None and (seen is None or lease.term >= seen.term):
            self._observed.seen(lease)
        return lease

    async def _read(self) -> Lease | None:
        try:
            lease = await self.election.read()
        except Exception as error:  # the API server or the file unreachable for a moment: try again
            self._say(f"cannot read the job's lease: {error!r}")
            return None
        self._observed.seen(lease)
        return lease

    async def _campaign(self) -> None:
        if self.leader is not None and self.election.renewing() and self.election.leading():
            held = True  # its renewal thread keeps the lease: a step would only add requests
        else:
            try:
                held = await self.election.step()
            except Exception as error:
                self._say(f"cannot take or renew the job's lease: {error!r}")
                held = False
        if held and self.leader is None:
            leader = await self._own_leader.lead(
                self.election.term, self.election.leading, self.own, self.election.taken_from
            )
            self.elected(leader)
            self.election.keep_renewing()
        elif self.leader is not None and self.leader.standing_down and self.election.leading():
            # It found itself fenced for a moment (its renewals late), or cut off from every member
            # (supervisor.leader.silence), and acts no more, for good: give the lease up, so that
            # another candidate takes the job over now, in a new term, rather than a leader that
            # acts on nothing keep it. Cut off, it campaigns again only once its own member reached
            # the next leader: until then it would only take the lease back from the others.
            self.cut_off = self.leader.silence.cut_off
            await self._stand_down(self.leader.silence.reason() if self.cut_off else "it found itself fenced")
            await self.election.release()
        elif self.leader is not None and not self.election.leading():
            await self._stand_down("lost the job's lease")
        self._observed.seen(self.election.observed())

    def adopt(self, election: Election, own: Holder, candidate: bool) -> None:
        """This spare took a host over: from now on it takes that host's part in the election (a
        candidate, or, where only a few are, one if the host is), as `own` (the host it serves
        named in its identity) on `election`. It never held the lease, so nothing is given up."""
        self._earlier_requests = self.lease_requests
        self.election, self.own, self.candidate = election, own, candidate

    @property
    def lease_requests(self) -> int:
        """The requests this supervisor made of the job's lease so far (reads and writes)."""
        return self._earlier_requests + self.election.lock.requests.value

    async def sure(self) -> bool:
        """This supervisor's leader may still write the job's last word: the lease renewed just now,
        in the same term. Renewals checked by time alone may lag on a loaded machine at the job's end
        (then the final status would be lost); a leader that lost the lease meanwhile writes nothing."""
        if self.leader is None:
            return False
        term = self.election.term
        try:
            held = await self.election.step()
        except Exception as error:  # the API server unreachable for a moment: the last renewal decides
            self._say(f"cannot renew the job's lease: {error!r}")
            return self.election.leading()
        return held and self.election.term == term

    async def release(self) -> None:
        """This supervisor is ending: if it leads, the lease goes to the next candidate at once."""
        if self.leader is not None:
            await self.election.release()

    async def _stand_down(self, reason: str) -> None:
        self.election.stop_renewing()
        leader = self._own_leader.vacate()
        self._say(f"{reason}: standing down as leader")
        leader.stand_down(reason)
        self.deposed()
        await leader.close()


class LeaderDuties:
    def __init__(
        self,
        plan: JobPlan,
        site: Site,
        *,
        persistent: PersistentTier | None,
        pod: PodAnnotations | None,
        goodput: Callable[[], float],
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
    ) -> None:
        self._plan = plan
        self._site = site
        self._persistent = persistent
        self._pod = pod
        self._goodput = goodput
        """This host's goodput so far, published with the job's status."""
        self._spawn = spawn
        self._tasks: list[asyncio.Task[None]] = []

    def new_leader(self, term: int, leading: Callable[[], bool]) -> Leader:
        """The job's leader for `term`, run by this supervisor while it holds the lease."""
        plan = self._plan
        spec = plan.training_job.spec
        return Leader(
            LeaderSettings.of_job(plan.shape, spec, Path(plan.run_dir), log_events=self._site.log_events),
            partial(_coordinator_address, self._site, plan.layout),
            persistent=self._persistent,
            engine=PolicyEngine.from_spec(spec.policy),
            replacements=self._site.replacements(),
            term=term,
            leading=leading,
        )

    def begin(self, leader: Leader) -> None:
        """This supervisor leads now: it publishes the job's status (to watchers, on its pod)."""
        self.end()
        self._tasks = [self._spawn(leader.publish_status())]
        if self._pod is not None:
            published = self._pod.keep_status_published(partial(self.status, leader), leader.leading)
            self._tasks.append(self._spawn(published))

    def end(self) -> None:
        """It leads no more: its publishing stops."""
        for task in self._tasks:
            task.cancel()
        self._tasks = []

    async def publish_last(self, leader: Leader, sure: Callable[[], Awaitable[bool]]) -> None:
        """The job ended under this leader: its final status reaches members, watchers and, once
        `sure` confirms it still leads, the pod."""
        await asyncio.sleep(LAST_BROADCAST_SECONDS)
        if self._pod is not None and await sure():
            await self._pod.publish_status(dict(self.status(leader)))

    def status(self, leader: Leader) -> LeaderView:
        """The job's status as the operator reads it from the leader's pod."""
        view = leader.cluster_status()
        view["goodput"] = round(self._goodput(), 4)
        return view


def _coordinator_address(site: Site, layout: JobLayout, generation: int, rank0: int) -> str:
    """Where generation `generation`'s workloads find JAX's coordinator: the site's address for rank
    0's host (the same whatever the generation)."""
    return site.coordinator_address(layout, rank0)
