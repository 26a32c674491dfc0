"""This host's membership of its job: joining the leader, following its commands, rejoining the next.

A host's supervisor joins the leader the job's lease names (supervisor.leader_connection), registers
(a spare offers itself and waits to be assigned a host), then reads the leader's commands in order,
ignoring any of a term older than the newest it has seen (fencing, supervisor.leader.election), and
hands each to the supervisor to carry out. When the leader is lost (its connection ends, or a leader
of a newer term appears in the lease) it finds the next one and registers again, now as a rejoining
member: with the newest journal it holds, the generation it is in and the furthest step it completed,
and it repeats its `finished` report if its workload finished meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from slicekeeper.supervisor import connection_deadline, leader_connection, messages
from slicekeeper.supervisor.host.leadership import Leadership
from slicekeeper.supervisor.host.relay import through_relays
from slicekeeper.supervisor.leader.members import send

LAST_LINES_SECONDS = 0.1
"""A superseded leader's lines still unread are read until none comes for this long."""

Obey = Callable[[messages.Command], Awaitable[bool]]
"""Carries out one command; True: this host's part in the job ended."""


class LeaderSearch(Protocol):
    """What the site (supervisor.host.site) says about looking for a leader."""

    @property
    def leader_wait(self) -> float:
        """How long a leader is looked for (supervisor.leader_connection)."""

    @property
    def leader_unreachable_exit_code(self) -> int:
        """How this host ends when no leader was found (read when it is given up on)."""


class Membership:
    def __init__(
        self,
        leadership: Leadership,
        site: LeaderSearch,
        *,
        finished: asyncio.Event,
        say: Callable[[str], None],
        connection_deadline: float = 0.0,
        relays: Callable[[], list[str]] = list,
    ) -> None:
        """`connection_deadline`: spec.health.connectionDeadlineSeconds, imposed on the connection to
        each leader (supervisor.connection_deadline): a leader cut off is given up on within it.
        `relays()`: the relays this host reaches each leader through, in the order tried
        (supervisor.host.relay; empty: directly)."""
        self._relays = relays
        self._leadership = leadership
        self._connection_deadline = connection_deadline
        self._site = site
        """How long a leader is looked for, and how this host ends when none is found."""
        self._finished = finished
        self._say = say
        self.writer: asyncio.StreamWriter | None = None
        """The connection to the current leader: reports go there."""
        self.term = 0
        """The newest leader term heard from: commands of older terms are ignored."""
        self.finished_report: messages.Finished | None = None
        """This host's `finished` report, said again to a leader taking over."""
        self.exit_code: int | None = None
        """Set when no leader could be reached, or reading the leader failed."""
        self.progress = ProgressReports()
        self._kept: leader_connection.Streams | None = None
        """The connection to this host's relay, kept by the relay when its leader went: the next
        leader is named on it."""

    async def report(self, message: messages.MemberReport) -> None:
        """A report to the leader (the supervisor stamped it with the host it serves). Progress is
        said every `Start.progress_every` steps (`ProgressReports`); any other report first says the
        progress held back, so that the leader reads everything in the order it happened."""
        if isinstance(message, messages.Finished):
            self.finished_report = message
        if isinstance(message, messages.Progress):
            due = self.progress.due(message)
            if due is None:
                return
            message = due
        else:
            held_back = self.progress.flush()
            if held_back is not None:
                await self._say_to_leader(held_back)
        await self._say_to_leader(message)

    async def _say_to_leader(self, message: messages.MemberReport) -> None:
        if self.writer is not None and not self.writer.is_closing():  # between leaders: said again later
            self.writer.write(message.encode())
            with contextlib.suppress(OSError):  # ConnectionError, or ssl.SSLError on a cut TLS stream
                await self.writer.drain()

    async def run(
        self,
        hello: dict[str, Any],
        register: Callable[[dict[str, Any], bool], messages.Register | messages.RegisterSpare],
        *,
        obey: Obey,
        assigned: Callable[[messages.Assign], Awaitable[None]],
    ) -> None:
        """Join and follow leaders until this host's part ends. `register(hello, rejoining)`: the message
        that joins a leader; a spare's (`RegisterSpare`) waits for `assign`, and `assigned` makes it
        the host assigned before the leader's next command is read. `hello`: what every
        registration of this machine says (its metrics port, process, machine, replica address)."""
        term, joined = 0, False
        while not self._finished.is_set():
            found = await self._reach(term)
            if found is None:
                return
            reader, self.writer, term, address = found
            connection_deadline.impose_on(self.writer, self._connection_deadline)
            self._leadership.cut_off = False  # a leader is reached: this host may lead again
            joining = register(hello, joined)
            await send(self.writer, joining)
            if isinstance(joining, messages.RegisterSpare):
                assignment = self._await_assignment(reader, assigned)
                outcome = await self._until_superseded(assignment, term, address)
                if outcome is False:
                    return
            else:
                if joined and self.finished_report is not None:
                    await self.report(self.finished_report)
                outcome = True
            if outcome:
                joined = True
                ended = await self._until_superseded(self._commands(reader, obey), term, address)
                if ended is None:
                    await self._last_journals(reader, obey)
                if ended or self._finished.is_set():
                    return
            if self._kept is None:
                self.writer.close()
            if not self._finished.is_set():
                self._say(f"lost the leader (term {term}); looking for the next one")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self._kept is not None:
            self._kept[1].close()

    async def _connect(self, host: str, port: int) -> leader_connection.Streams:
        """A connection to the leader at host:port: the relay connection its last leader's relay
        kept (the relay told it that leader is gone), naming the next leader on it, or a new one
        through the host's relays (or directly)."""
        kept, self._kept = self._kept, None
        if kept is not None:
            reader, writer = kept
            if not writer.is_closing() and not reader.at_eof():
                writer.write(messages.RelayTo(leader=f"{host}:{port}").encode())
                return reader, writer
            writer.close()
        return await through_relays(self._relays(), self._leadership.tls)(host, port)

    async def _reach(self, term: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int, str] | None:
        self._leadership.looking = True
        try:
            return await leader_connection.reach_leader(
                self._leadership.current,
                term=term,
                wait=self._site.leader_wait,
                open_connection=self._connect,
            )
        except leader_connection.LeaderUnreachable as unreachable:
            self.exit_code = self._site.leader_unreachable_exit_code
            self._say(f"{unreachable}: exit {self.exit_code}")
            return None
        finally:
            self._leadership.looking = False

    async def _read_line(self, reader: asyncio.StreamReader) -> bytes:
        """The next line from the leader; b"" when its connection ended, or sent a line longer than
        protocol.CONTROL_LINE_LIMIT (what follows it cannot be told from a command: the connection
        is given up, and the leader found again)."""
        try:
            line = await reader.readline()
        except OSError:  # reset, the TLS stream cut (ssl.SSLError), its deadline passed (TimeoutError)
            return b""
        except ValueError as error:  # over the limit (asyncio.LimitOverrunError's ValueError)
            self._say(f"the leader sent a line over the limit ({error}): connecting again")
            return b""
        if line == messages.LEADER_GONE and self.writer is not None:
            self._kept = (reader, self.writer)  # its relay keeps it for the next leader (_connect)
            return b""
        return line

    def _command(self, line: bytes) -> messages.Command | None:
        """`_current`, a malformed line logged and ignored (a member never ends on one)."""
        try:
            return self._current(line)
        except ValueError as error:
            self._say(f"ignored a malformed command from the leader {line[:200]!r}: {error}")
            return None

    def _current(self, line: bytes) -> messages.Command | None:
        """The command on `line`, unless a leader of an older term said it (fenced)."""
        message = messages.command(line)
        if message.term < self.term:
            return None
        self.term = message.term
        return message

    async def _await_assignment(
        self, reader: asyncio.StreamReader, assigned: Callable[[messages.Assign], Awaitable[None]]
    ) -> bool | None:
        """As a spare: True once assigned a host; False: the job ended without needing it; None: the
        leader was lost (the spare offers itself to the next one)."""
        while line := await self._read_line(reader):
            match self._command(line):
                case messages.Assign() as assign:
                    await assigned(assign)
                    return True
                case messages.Shutdown() | messages.Failed():
                    self.exit_code = 0  # the job ended without needing this spare
                    return False
        return None

    async def _commands(self, reader: asyncio.StreamReader, obey: Obey) -> bool:
        """The leader's commands, carried out in order; True: this host's part ended."""
        while line := await self._read_line(reader):
            command = self._command(line)
            if isinstance(command, messages.Start):
                self.progress.start(command)
            if command is not None and await obey(command):
                return True
        return False

    async def _last_journals(self, reader: asyncio.StreamReader, obey: Obey) -> None:
        """The leader followed was superseded: the journals it wrote that are still unread here are
        kept all the same (a journal is written before the command it leads to, and the newest one
        a member holds is what the next leader carries on), its other commands are not carried out.
        Lines already received are read at once; the first pause ends it."""
        while True:
            try:
                line = await asyncio.wait_for(reader.readline(), LAST_LINES_SECONDS)
                journal = messages.command(line) if line.endswith(b"\n") else None
            except (TimeoutError, OSError, ValueError):
                return
            if journal is None:
                return
            if isinstance(journal, messages.Journal):
                await obey(journal)

    async def _until_superseded(
        self, reading: Coroutine[Any, Any, bool | None], term: int, address: str
    ) -> bool | None:
        """`reading` the leader of `term` at `address`, until it returns, this supervisor ends, or a
        leader of a newer term elsewhere is seen in the lease (None: then follow that one)."""
        lines = asyncio.create_task(reading)
        finished = asyncio.create_task(self._finished.wait())
        superseded = asyncio.create_task(self._leadership.superseded(term, address))
        await asyncio.wait({lines, finished, superseded}, return_when=asyncio.FIRST_COMPLETED)
        finished.cancel()
        superseded.cancel()
        if not lines.done():
            lines.cancel()
            return None
        if not lines.cancelled() and lines.exception() is not None:
            traceback.print_exception(lines.exception(), file=sys.stderr)
            self.exit_code = 1
            return True
        return None if lines.cancelled() else lines.result()


class ProgressReports:
    """Which of a host's steps it reports to the leader as they end: the first of a generation (the
    job trains again), then one in `progress_every`, spread over the hosts by their rank, each
    carrying the steps held back since the previous one. A job of 25,000 hosts with `progress_every`
    10 sends the leader 2,500 reports a step instead of 25,000, with the same steps in them."""

    def __init__(self) -> None:
        self._every, self._rank = 1, 0
        self._held: list[messages.Progress] = []
        self._first = True

    def start(self, start: messages.Start) -> None:
        """A generation starts (what was held back belongs to the one before)."""
        self._every, self._rank = max(1, start.progress_every), start.rank
        self._held, self._first = [], True

    def due(self, progress: messages.Progress) -> messages.Progress | None:
        """The report to send now for `progress` (None: held back)."""
        self._held.append(progress)
        if self._first or (progress.step + self._rank) % self._every == 0:
            self._first = False
            return self.flush()
        return None

    def flush(self) -> messages.Progress | None:
        """The latest step held back, carrying the others (None: nothing held)."""
        if not self._held:
            return None
        *earlier, latest = self._held
        self._held = []
        if not earlier:
            return latest
        return latest.model_copy(update={"earlier": [(p.step, p.t, p.work) for p in earlier]})
