"""The leader of a job: a JSON-lines server every supervisor of the job (its own included) joins.

It reads what the members report (messages.ToLeader) and hands each report to the part whose job it
is (leader.dispatch): who joins (registrations), the restart state machine (generations),
remediation (faults, lost hosts, stragglers, capacity), the checkpoint records (checkpoints), the
job's memory (journal). It owns only the connections and the wiring; the parts get the leader's
context and each other, never this object.

A leader elected in place of a lost one (supervisor.leader.election) takes over (`take_over`): for a
moment it only gathers the members re-registering, each with the newest journal it holds; it carries
on the newest of them, then treats the old leader's host like any lost host (a stop, the policy's
decision, the next generation), so the job's memory, budgets included, goes on unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

from slicekeeper.supervisor import connection_deadline, messages
from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTier
from slicekeeper.supervisor.checkpoints.restore_plan import RestorePlan
from slicekeeper.supervisor.leader import relay_link, restart_events
from slicekeeper.supervisor.leader import status as views
from slicekeeper.supervisor.leader.admission import HostState
from slicekeeper.supervisor.leader.background import BackgroundWork, Task
from slicekeeper.supervisor.leader.capacity import Replacement, Replacements, spare_pool
from slicekeeper.supervisor.leader.checkpoints import Checkpoints
from slicekeeper.supervisor.leader.context import LeaderContext
from slicekeeper.supervisor.leader.decisions import Decisions
from slicekeeper.supervisor.leader.dispatch import Dispatch
from slicekeeper.supervisor.leader.election import Holder
from slicekeeper.supervisor.leader.fence import Fence
from slicekeeper.supervisor.leader.generations import Generations
from slicekeeper.supervisor.leader.journal import JobMemory, JournalWriter
from slicekeeper.supervisor.leader.members import HostStatus, Members
from slicekeeper.supervisor.leader.relay_link import RelayLink
from slicekeeper.supervisor.leader.remediation import Remediation
from slicekeeper.supervisor.leader.restart_inbox import RestartInbox
from slicekeeper.supervisor.leader.restart_rule import RestartRule
from slicekeeper.supervisor.leader.restart_state import CARRYING_ON, JobState
from slicekeeper.supervisor.leader.settings import LeaderSettings
from slicekeeper.supervisor.leader.silence import Silence
from slicekeeper.supervisor.leader.takeover import SECONDS as takeover_seconds
from slicekeeper.supervisor.leader.takeover import Takeover
from slicekeeper.supervisor.leader.world import JobWorld
from slicekeeper.supervisor.tls import JobTls

from slicekeeper import protocol
from slicekeeper.policy.engine import PolicyEngine

LISTEN_BACKLOG = 4096
"""Connections waiting to be accepted (the kernel caps it at net.core.somaxconn): every member of a
job of thousands reconnects at once to a new leader, and asyncio's default of 100 drops the rest's
SYNs, each then tried again only after a second or more."""


class Leader:
    def __init__(
        self,
        settings: LeaderSettings,
        coordinator_address: Callable[[int, int], str],
        *,
        persistent: PersistentTier | None = None,
        engine: PolicyEngine | None = None,
        replacements: Replacements = spare_pool,
        term: int = 1,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        """`settings`: what the job's spec tells its leader (leader.settings). `coordinator_address`:
        where the workloads of a generation find JAX's coordinator, by generation and rank 0's host.
        `replacements`: where a lost host's new machine comes from (leader.capacity: the site's choice,
        spare supervisors locally, new pods in a cluster). `term`, `leading`: this leader's term and
        whether it still surely holds the job's lease (supervisor.leader.election): unsure once, it
        stands down for good (leader.fence)."""
        self.leading = Fence(leading)
        leading = self.leading
        inbox = RestartInbox()
        self.context, self._job_journal = LeaderContext.of_job(
            settings,
            BackgroundWork(leading=leading, inbox=inbox),
            persistent=persistent,
            engine=engine or PolicyEngine(None),
            replacements=replacements,
            term=term,
        )
        """What the leader's parts share (leader.context)."""
        self.generations = Generations(
            self.context,
            rule=RestartRule(settings.max_restarts, settings.max_restarts_without_progress),
            coordinator_address=coordinator_address,
            summary_path=settings.summary_path,
            peer_replicas=settings.peer_replicas,
        )
        self.remediation = Remediation(self.context, generations=self.generations)
        inbox.attach(self.generations, self.remediation)
        self.dispatch = Dispatch(self.context, generations=self.generations, remediation=self.remediation)
        """What the members say, each report to its part."""
        self._standing_down = False
        """The leader's process is ending (`stand_down`): it acts no more."""
        self.leading.on_broken = self._fenced
        self._server: asyncio.Server | None = None
        self._tls: JobTls | None = None
        self._takeover: Takeover | None = None
        """While taking over from a lost leader: the re-registrations gathered so far."""
        self.silence = Silence(settings.connection_deadline)
        """The members' connections' deadline, and the judge of one that ended silently: that host
        lost, or this leader cut off."""

    # --- the parts, as the rest of the supervisor and the views read them ------------------------
    @property
    def memory(self) -> JobMemory:
        """The job's memory (leader.journal): what a leader that takes over carries on."""
        return self.context.memory

    @property
    def world(self) -> JobWorld:
        return self.context.world

    @property
    def members(self) -> Members:
        return self.context.members

    @property
    def status(self) -> dict[int, HostStatus]:
        return self.context.status

    @property
    def background(self) -> BackgroundWork:
        """The one way this leader runs work in the background (tasks, timers): fenced, and a
        failure is the job's outcome."""
        return self.context.background

    @property
    def decisions(self) -> Decisions:
        return self.context.decisions

    @property
    def checkpoints(self) -> Checkpoints:
        return self.context.checkpoints

    @property
    def capacity(self) -> Replacement:
        return self.context.capacity

    @property
    def journal_writer(self) -> JournalWriter:
        return self.context.journal

    @property
    def standing_down(self) -> bool:
        """It acts no more (`stand_down`): its process is ending, or it found itself fenced."""
        return self._standing_down

    @property
    def done(self) -> asyncio.Event:
        return self.generations.done

    @property
    def task_failures(self) -> Counter[Task]:
        """Failed background work, by what it was (slicekeeper_leader_task_failures_total)."""
        return self.background.failures

    # --- the job's memory as data -------------------------------------------------------------
    def journal(self) -> dict[str, Any]:
        """All the job's memory as JSON: what a leader taking over needs to carry on (`carry_on`)."""
        return self._job_journal.state()

    def carry_on(self, journal: dict[str, Any]) -> None:
        """Take over the memory another leader of this job wrote down (`journal`)."""
        self._job_journal.carry_on(journal)

    # --- taking over from a lost leader -------------------------------------------------------
    def take_over(
        self, previous: Holder | None, own: Holder, journal: messages.Journal | None, lost_at: float
    ) -> None:
        """This leader (`own`) replaces `previous`, whose lease was last seen renewed at `lost_at`;
        `journal`: the newest one this leader's own member holds (leader.takeover)."""
        self._takeover = Takeover(
            previous,
            own,
            journal,
            lost_at,
            context=self.context,
            carry_on=self._job_journal.carry_on,
            handle=self.dispatch.handle,
            host_lost=self.remediation.host_lost,
            restart=self.generations.send,
        )
        self.background.spawn(Task.TAKEOVER, self._take_over(self._takeover))

    async def _take_over(self, takeover: Takeover) -> None:
        await takeover.settle()
        self._takeover = None  # from now on every message is handled as it comes
        previous = {takeover.previous.host} if takeover.previous else set()
        if not takeover.heard_another and set(self.world.hosts) - {takeover.own.host} - previous:
            self.silence.cut_off = True
            self.stand_down(f"heard no other machine within {takeover_seconds:g} s of its election: cut off")
            return
        # While the gathered registrations and messages are taken in order: no start yet (a member
        # taken in early, an idle one say, must not start the job before the others are back).
        await self.generations.send(restart_events.Hold(CARRYING_ON))
        try:
            await takeover.carry_on_and_recover()
        finally:
            await self.generations.send(restart_events.Release(CARRYING_ON))
        await self.generations.send(self.generations.reconsider())

    # --- the server ---------------------------------------------------------------------------
    async def serve(
        self,
        address: str,
        port: int,
        sock: socket.socket | None = None,
        tls: JobTls | None = None,
        *,
        own_host: int | None = None,
    ) -> int:
        """Listen on `address:port`, or on `sock` (bound already: a port reserved at start-up).
        `tls`: the job's credentials, required of every client (None: plain TCP, in unit tests).
        `own_host`: the host whose supervisor serves it."""
        self._tls, self.silence.own_host = tls, own_host
        if sock is not None:
            self._server = await asyncio.start_server(
                self._connection, sock=sock, limit=protocol.CONTROL_LINE_LIMIT, backlog=LISTEN_BACKLOG
            )
        else:
            self._server = await asyncio.start_server(
                self._connection, address, port, limit=protocol.CONTROL_LINE_LIMIT, backlog=LISTEN_BACKLOG
            )
        return int(self._server.sockets[0].getsockname()[1])

    def stand_down(self, reason: str) -> None:
        """This leader's process is ending (SIGTERM: the pod deleted, the job suspended): it acts no
        more. Members' connections dropping now are its own ending, not hosts lost, and no decision
        is taken on them; the job's memory stays as it was (a leader taking over carries it on)."""
        if not self._standing_down:
            self._standing_down = True
            self.background.stand_down()
            self.background.spawn(Task.STAND_DOWN, self.members.event(f"leader standing down: {reason}"))

    def _fenced(self) -> None:
        self.stand_down("no longer sure to hold the job's lease")

    async def close(self) -> None:
        self.background.cancel()
        if self._server is not None:
            self._server.close()
        self.members.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A connection to the leader's port: a member's, a watcher's, or a relay's, which carries
        many members' (supervisor.leader.relay_link: each is then served as if it came here)."""
        if self._tls is not None and not await self._tls.accept("leader", writer):
            return  # refused before a message was read: never a member, nothing to disconnect
        connection_deadline.impose_on(writer, self.silence.deadline)
        try:
            first = await reader.readline()
        except (OSError, ValueError):  # (TimeoutError is an OSError) never a member: nothing to lose
            first = b""
        except asyncio.CancelledError:  # the process is ending
            return
        relay = messages.relay_hello(first)
        if relay is not None:
            await self.members.event(f"relay of group {relay.group} connected")
            with contextlib.suppress(asyncio.CancelledError):
                link = RelayLink(
                    reader,
                    writer,
                    self._member,
                    relay_link.REJOIN_SECONDS,
                    relay_host=relay.host,
                    host_of=self.members.host_of,
                    deliver=self._take,
                )
                await link.run()
            writer.close()
            if not self._quiet():
                await self.members.event(f"relay of group {relay.group}: its connection ended")
            return
        await self._member(reader, writer, first)

    async def _member(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, first: bytes | None = None
    ) -> None:
        """A member's (or a watcher's) connection, `first` its first line when already read: each
        line handled in turn; its end, a lost host."""
        silent = ending = False
        try:
            async for line in _lines(reader, first):
                if not line.endswith(b"\n"):
                    break  # cut short by the end of its connection: not a whole message, not acted on
                await self._take(line, writer)
        except TimeoutError:  # its deadline passed in silence (supervisor.connection_deadline)
            silent = True
        except OSError:  # reset, or a cut TLS stream (ssl.SSLError)
            pass
        except asyncio.CancelledError:  # the process is ending (asyncio.run's teardown)
            ending = True  # no host is lost for that, and no traceback is said
        except ValueError as error:
            # A line over CONTROL_LINE_LIMIT (readline's ValueError; a message's own is caught above):
            # what follows it cannot be told apart from a message, so the connection is dropped (a
            # member's reads as its host lost). There is no read timeout: a member may rightly stay
            # silent for long (a long step, a restore), and the limit is what bounds the memory a
            # slow or stalled sender holds.
            print(f"leader: dropped a connection: {error}", file=sys.stderr)
            writer.close()
        finally:
            if not ending:
                # Cancelled in here, the process is ending too: a cancelled handler is reported by
                # Python 3.11's stream server as an "Exception in callback", with a traceback, for
                # every host whose loss was waiting its turn (9,991 at a 10,000-host benchmark's end).
                with contextlib.suppress(asyncio.CancelledError):
                    await self._disconnected(writer, silent)

    async def _take(self, line: bytes | dict[str, Any], writer: asyncio.StreamWriter) -> None:
        """One line of a member's (read already, when it came gathered through a relay)."""
        if not self.leading() or self._standing_down:
            return  # it reads on (its members' connections stay open) and acts no more
        try:
            message = messages.to_leader(line) if isinstance(line, bytes) else messages.to_leader_value(line)
            if self._takeover is not None and not isinstance(message, messages.Watch):
                self._takeover.gather(message, writer)
                return
            await self.dispatch.handle(message, writer)
        except (ValueError, KeyError, TypeError) as error:
            # A bad message must not end the connection: that would read as a lost host.
            print(f"leader: ignored a malformed message {str(line)[:200]!r}: {error!r}", file=sys.stderr)

    async def _disconnected(self, writer: asyncio.StreamWriter, silent: bool = False) -> None:
        if writer in self.members.watchers:
            self.members.watchers.remove(writer)
        if silent and self.members.host_of(writer) and not self._quiet():
            await self._judge_silence(writer)
        quiet = self._quiet()
        for spare in self.capacity.lost(writer):
            if not quiet:
                await self.members.event(f"{spare} lost while idle")
        for host in self.members.host_of(writer):
            if quiet:
                continue
            # The acknowledgements read before its loss are taken while it is still a member: taken
            # after, a stop it never acknowledged would look complete without it.
            await self.generations.take_acks()
            self.members.drop(host)
            lost = self.status[host]
            lost.state, lost.committed, lost.replicas = HostState.LOST, set(), {}
            await self.generations.send(restart_events.MemberLost(host))
            await self.remediation.host_lost(host, lost.machine)

    async def _judge_silence(self, writer: asyncio.StreamWriter) -> None:
        """A member's connection ended at its deadline: this leader stands down if every other
        member's did too (supervisor.leader.silence); else the member is lost, as any other."""
        if await self.silence.cut_off_after(writer, lambda: self.members.writers.items()):
            self.stand_down(self.silence.reason())

    def _quiet(self) -> bool:
        """A member's connection ending now is no lost host: the job ended, or this leader is fenced."""
        return self.generations.over or self._standing_down or not self.leading()

    # --- views --------------------------------------------------------------------------------
    def restore_plan(self) -> RestorePlan:
        return self.checkpoints.restore_plan()

    def status_message(self) -> messages.Status:
        return views.status_line(self.memory, self.status)

    def cluster_status(self) -> views.LeaderView:
        fingerprints = {f.fingerprint for f in self.generations.finished.values()}
        agreed = (
            fingerprints.pop() if self.memory.state is JobState.SUCCEEDED and len(fingerprints) == 1 else None
        )
        return views.cluster_status(
            self.memory,
            self.world,
            self.restore_plan().step,
            self.capacity.awaiting(),
            term=self.members.term,
            params_fingerprint=agreed,
        )

    def summary(self) -> dict[str, Any]:
        return self.generations.summary()

    async def publish_status(self, interval: float = 0.5) -> None:
        while not self.done.is_set():
            if self.members.watchers:  # a line per host: not made for nobody
                self.members.notify(self.status_message())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), interval)
        self.members.notify(self.status_message())


async def _lines(reader: asyncio.StreamReader, first: bytes | None) -> AsyncIterator[bytes]:
    """The lines of a connection, `first` (already read) first, until its end."""
    if first is not None:
        if not first:
            return
        yield first
    while line := await reader.readline():
        yield line
