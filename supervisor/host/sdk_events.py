"""What the workload says through its SDK: the socket it says it on, and whose word counts.

The workload's SDK writes one JSON line per event to a Unix socket (`slicekeeper/protocol.py`):
phases, step begin / own work done / step end, checkpoints saved, failed or restored, done. Only the
current generation's workload's word counts; each of its events is logged, its fields checked, and
then it takes effect on this host (host.sdk_effects: the hang detector, the culprit tracker, the
goodput accountant, the metrics, the leader). A pre-started standby process connects early and says
hello; it speaks for a generation only once promoted.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slicekeeper.supervisor.host.context import HostContext
from slicekeeper.supervisor.host.sdk_effects import EventEffects
from slicekeeper.supervisor.host.workload import Standby, send_sdk_line
from slicekeeper.supervisor.signals.culprit import ActivityTracker
from slicekeeper.supervisor.signals.hang import HangDetector

from slicekeeper import protocol
from slicekeeper.protocol import Event

_WITH_STEP = {event for event in Event if event not in (Event.HELLO, Event.PHASE, Event.PROGRAMS)}
_NAMES_LIMIT = 64
"""Program names a `programs` event may list, in each of its lists."""


def _real(value: Any) -> bool:
    """A JSON number a float holds (NaN and the infinities included), not a bool."""
    return isinstance(value, float) or (
        isinstance(value, int) and not isinstance(value, bool) and abs(value) <= sys.float_info.max
    )


_FIELDS: dict[str, Callable[[Any], bool]] = {
    "step": lambda value: isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63,
    "loss": lambda value: value is None or _real(value),  # a non-finite loss is news, not an error
    "work": lambda value: value is None or (_real(value) and 0 <= value < math.inf),
    "fingerprint": lambda value: value is None or isinstance(value, str),
    "tier": lambda value: isinstance(value, str),
    "reason": lambda value: isinstance(value, str),
    "during": lambda value: isinstance(value, str),
    "loaded": lambda value: _names(value),
    "compiled": lambda value: _names(value),
    "backend_compiled": lambda value: _names(value),
    "backend_compiles": lambda value: (
        isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31
    ),
}
"""What each field an event may carry must be (a step: a 64-bit count), checked before any of it is
used: a workload's malformed word is ignored here rather than forwarded to the leader (which would
refuse the report), set on a metric or kept for the exit (a `done` without a step)."""


def _names(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) <= _NAMES_LIMIT
        and all(isinstance(name, str) and len(name) <= 200 for name in value)
    )


def _event(message: dict[str, Any]) -> Event:
    """The event `message` is; ValueError naming the field that is missing or not of its type."""
    event = Event(message["type"])
    if event in _WITH_STEP and "step" not in message:
        raise ValueError(f"{event.value} without a step")
    for name, valid in _FIELDS.items():
        if name in message and not valid(message[name]):
            raise ValueError(f"{event.value} with an invalid {name}: {message[name]!r:.80}")
    return event


def _said_hello(standby: Standby, line: bytes) -> bool:
    """Whether `line` is the standby process's hello (a malformed line is not: it is read as an event)."""
    try:
        return standby.is_hello(protocol.decode(line))
    except ValueError:
        return False


class SdkEvents:
    """The SDK socket's server: whose word counts (the current generation's workload, its standby once
    promoted), the way back to it, and its events handed on to take effect (host.sdk_effects)."""

    def __init__(
        self,
        context: HostContext,
        *,
        detector: HangDetector,
        activity: ActivityTracker,
        checkpoint_saved: Callable[[int], None],
        standby: Callable[[], Standby | None],
        step_begun: Callable[[int], None],
        productive_again: Callable[[], object],
        work_done: Callable[[int], None] = lambda step: None,
    ) -> None:
        """`checkpoint_saved`: the tiers' hook for a committed local step; `standby`: the pre-started
        process, if any; `step_begun`, `work_done`: the chaos faults' triggers; `productive_again`:
        the moment to pre-start the next standby, the end of the generation's first step beyond what
        this host had done before it started: a standby's imports (seconds of CPU) started earlier
        slowed the first step and the steps executed again, the recovery itself."""
        self._context = context
        self._standby = standby
        self._effects = EventEffects(
            context,
            detector=detector,
            activity=activity,
            checkpoint_saved=checkpoint_saved,
            step_begun=step_begun,
            work_done=work_done,
            productive_again=productive_again,
        )
        self._generation = -1
        """The generation whose workload's word counts (`begin`), unless `_stopping` (`stopped`)."""
        self._stopping = False
        self._eof: dict[int, asyncio.Event] = {}
        """Per generation: set when that workload's SDK connection has been read to the end."""
        self._speaking: tuple[int, asyncio.StreamWriter] | None = None
        """The generation whose workload is connected now, and the way to it (`request_save`)."""
        self._server: asyncio.Server | None = None

    @property
    def done(self) -> dict[str, Any] | None:
        """The current generation's `done` event: it finished training (its exit says the rest)."""
        return self._effects.done

    @property
    def fingerprint(self) -> str | None:
        """The parameters' fingerprint of the newest `done`."""
        return self._effects.fingerprint

    @property
    def last_checkpoint(self) -> int | None:
        """The newest committed local step."""
        return self._effects.last_checkpoint

    async def serve(self, path: Path) -> asyncio.Server:
        """Listen on the Unix socket `path`, which only the job's user may connect to: its mode is 0600,
        set before it listens, so no connection comes in under the looser mode the umask gives.
        Lines are bounded (protocol.SDK_LINE_LIMIT) but reads are not timed: a workload may rightly
        stay silent for long (compiling, a long step), and the hang detector judges its silence."""
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(path))
            os.chmod(path, 0o600)
        except OSError:
            sock.close()
            raise
        self._server = await asyncio.start_unix_server(
            self._connection, sock=sock, limit=protocol.SDK_LINE_LIMIT
        )
        return self._server

    def close(self) -> None:
        """Listen no more (the supervisor ends)."""
        if self._server is not None:
            self._server.close()

    def drop_checkpoints_after(self, restore_step: int | None) -> None:
        """The steps after the restore step are dropped from every tier of this machine: the newest
        committed step is now the restore step (none: from scratch). Called before the generation
        moves, so that no scrape of the new generation sees a dropped step."""
        self._effects.drop_checkpoints_after(restore_step)

    def begin(self, generation: int, restore_step: int | None, now: float, *, host_count: int) -> None:
        """A generation of `host_count` hosts starts: its workload's word counts; a new process (the
        startup allowance applies again, then the first steps' allowance for its world), nothing done
        yet, its first step to come, no sanity check (yet)."""
        self._generation, self._stopping = generation, False
        self._effects.begin(restore_step, now, host_count=host_count)
        self._eof[generation] = asyncio.Event()

    def stopped(self, generation: int) -> None:
        """Generation `generation` is being stopped (or this host parked): no workload's word counts
        until the next `begin`."""
        self._generation, self._stopping = generation, True

    def check_restored_steps(self) -> None:
        """The restore step was staged: the next steps' losses must be finite."""
        self._effects.check_restored_steps()

    async def request_save(self, generation: int, step: int) -> bool:
        """Ask generation `generation`'s workload to save `step` and hold (protocol.SAVE_AT): False
        when no workload of that generation is connected to ask."""
        if self._speaking is None or self._speaking[0] != generation or self._speaking[1].is_closing():
            return False
        with contextlib.suppress(ConnectionError):
            await send_sdk_line(self._speaking[1], {"type": protocol.SAVE_AT, "step": step})
            return True
        return False

    def eof(self, generation: int) -> asyncio.Event:
        """Set once generation `generation`'s SDK connection has been read to the end."""
        return self._eof[generation]

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        generation = self._generation
        try:
            line = await reader.readline()
            standby = self._standby()
            if line and standby is not None and _said_hello(standby, line):
                standby.writer = writer
                standby.ready.set()
                promoted = asyncio.ensure_future(standby.promoted.wait())
                exited = asyncio.ensure_future(standby.process.wait())
                await asyncio.wait({promoted, exited}, return_when=asyncio.FIRST_COMPLETED)
                promoted.cancel()
                exited.cancel()
                if not standby.promoted.is_set():
                    return  # dropped or dead before it was needed
                generation = standby.generation  # it speaks for the generation it was promoted to
                line = await reader.readline()
            self._speaking = (generation, writer)
            while line:
                if generation != self._generation or self._stopping:
                    break  # a process of an older generation: its word no longer counts
                try:
                    await self._on_event(protocol.decode(line))
                except (ValueError, KeyError, TypeError) as error:
                    self._context.say(f"ignored a malformed SDK message {line[:200]!r}: {error!r}")
                line = await reader.readline()
        except ConnectionError:
            pass
        except asyncio.CancelledError:
            # The supervisor is ending (a waiting standby's handler, typically). Not raised on:
            # Python 3.11's stream server logs a handler task that ends cancelled as an error.
            pass
        except ValueError as error:  # a line over SDK_LINE_LIMIT (an event's own error is caught above)
            self._context.say(f"dropped the SDK connection, a line over its limit: {error}")
        finally:
            writer.close()
            if generation in self._eof:
                self._eof[generation].set()

    async def _on_event(self, message: dict[str, Any]) -> None:
        generation = self._generation
        self._context.log({"source": "workload", "generation": generation, **message})
        await self._effects.take(_event(message), message, generation)
