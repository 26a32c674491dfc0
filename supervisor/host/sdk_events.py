"""What the workload says through its SDK, and what this host makes of it.

The workload's SDK writes one JSON line per event to a Unix socket (`slicekeeper/protocol.py`):
phases, step begin / own work done / step end, checkpoints saved, failed or restored, done. Each
event feeds the hang detector (activity), the culprit tracker (where the workload is), the goodput
accountant (what the time is spent on) and the metrics, and the ones the leader needs are reported
to it. A pre-started standby process connects early and says hello; it speaks for a generation only
once promoted. Right after a restore, the first steps must give a finite loss, or the restored step
is declared bad.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoints.restore_plan import Tier
from slicekeeper.supervisor.culprit import ActivityTracker
from slicekeeper.supervisor.hang import HangDetector
from slicekeeper.supervisor.host.context import HostContext
from slicekeeper.supervisor.host.workload import Standby, send_sdk_line

from slicekeeper import protocol
from slicekeeper.goodput import PHASE_CATEGORY
from slicekeeper.policy.events import FaultKind
from slicekeeper.protocol import Event, Phase

SANITY_STEPS = 3
"""Steps after a restore whose loss must be finite, or the restored step is declared bad."""

_STEP_EVENTS = (Event.PHASE, Event.STEP_BEGIN, Event.WORK_DONE, Event.STEP_END)
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
    """The SDK socket's server and the handling of each event of the current generation's workload."""

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
        self._detector = detector
        self._activity = activity
        self._checkpoint_saved = checkpoint_saved
        self._standby = standby
        self._step_begun = step_begun
        self._work_done = work_done
        self._productive_again = productive_again
        self._generation = -1
        """The generation whose workload's word counts (`begin`), unless `_stopping` (`stopped`)."""
        self._stopping = False
        self.done: dict[str, Any] | None = None
        """The current generation's `done` event: it finished training (its exit says the rest)."""
        self.fingerprint: str | None = None
        """The parameters' fingerprint of the newest `done`."""
        self.last_checkpoint: int | None = None
        """The newest committed local step."""
        self._first_step_pending = True
        self._standby_after: int | None = 0
        """Pre-start the standby once a step beyond this one ends (None: done for this generation)."""
        self._sanity_left = 0
        self._restored_step: int | None = None
        self._eof: dict[int, asyncio.Event] = {}
        """Per generation: set when that workload's SDK connection has been read to the end."""
        self._speaking: tuple[int, asyncio.StreamWriter] | None = None
        """The generation whose workload is connected now, and the way to it (`request_save`)."""

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
        return await asyncio.start_unix_server(self._connection, sock=sock, limit=protocol.SDK_LINE_LIMIT)

    def drop_checkpoints_after(self, restore_step: int | None) -> None:
        """The steps after the restore step are dropped from every tier of this machine: the newest
        committed step is now the restore step (none: from scratch). Called before the generation
        moves, so that no scrape of the new generation sees a dropped step."""
        if self.last_checkpoint is not None and (restore_step is None or self.last_checkpoint > restore_step):
            self.last_checkpoint = restore_step
            self._context.metrics.last_checkpoint_step.set(restore_step or 0)

    def begin(self, generation: int, restore_step: int | None, now: float, *, host_count: int) -> None:
        """A generation of `host_count` hosts starts: its workload's word counts; a new process (the
        startup allowance applies again, then the first steps' allowance for its world), nothing done
        yet, its first step to come, no sanity check (yet)."""
        self._generation, self._stopping = generation, False
        self._detector.restart(now, host_count=host_count)
        self._activity.restart(now, restore_step)
        self.done = None
        self._first_step_pending = True
        self._standby_after = self._context.accountant.high_water
        self._eof[generation] = asyncio.Event()
        self._restored_step, self._sanity_left = restore_step, 0

    def stopped(self, generation: int) -> None:
        """Generation `generation` is being stopped (or this host parked): no workload's word counts
        until the next `begin`."""
        self._generation, self._stopping = generation, True

    def check_restored_steps(self) -> None:
        """The restore step was staged: the next steps' losses must be finite."""
        self._sanity_left = SANITY_STEPS

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
        now = time.time()
        generation = self._generation
        self._context.log({"source": "workload", "generation": generation, **message})
        event = _event(message)
        if event is Event.PHASE:
            phase = Phase(message["phase"])
            self._detector.activity(now, phase)
            self._activity.phase(now, phase.value)
            self._context.accountant.switch(PHASE_CATEGORY[phase], now)
        elif event is Event.STEP_BEGIN:
            step = int(message["step"])
            self._detector.activity(now, Phase.IDLE)
            self._activity.step_begun(now, step)
            self._context.accountant.begin_step(step, now, first_of_start=self._first_step_pending)
            self._step_begun(step)
        elif event is Event.WORK_DONE:
            # Not activity for the hang timer: silence is counted from the step's begin on every host,
            # the one that stopped and the ones waiting for it alike; the leader tells them apart.
            self._activity.work_done(now, int(message["step"]))
            self._work_done(int(message["step"]))
        elif event is Event.STEP_END:
            if not await self._step_ended(now, int(message["step"]), message):
                return
        elif event is Event.CHECKPOINT_SAVED:
            self._detector.activity(now)
            self.last_checkpoint = int(message["step"])
            self._context.metrics.last_checkpoint_step.set(self.last_checkpoint)
            self._checkpoint_saved(self.last_checkpoint)
            await self._context.report(messages.Committed(step=self.last_checkpoint))
        elif event is Event.CHECKPOINT_FAILED:
            await self._checkpoint_failed(now, message)
        elif event is Event.CHECKPOINT_RESTORED:
            self._detector.activity(now)
            # What the workload says it loaded, next to what this supervisor staged for it.
            await self._context.report(messages.Loaded(generation=generation, step=int(message["step"])))
        elif event is Event.DONE:
            self._detector.activity(now, Phase.TEARDOWN)  # it must still exit, within the phase allowance
            self.done = message
            self.fingerprint = message.get("fingerprint")
        else:
            self._detector.activity(now)
        if event not in _STEP_EVENTS:
            self._activity.other(now)

    async def _step_ended(self, now: float, step: int, message: dict[str, Any]) -> bool:
        """A step ended; False when its loss condemned the restored step (nothing more to do)."""
        self._activity.step_ended(now, step)
        duration = self._context.accountant.end_step(step, now)
        self._detector.step_completed(now, duration)
        self._first_step_pending = False
        if self._standby_after is not None and step > self._standby_after:
            self._standby_after = None
            self._productive_again()
        if duration is not None:
            self._context.metrics.step_duration.observe(duration)
        if self._sanity_left > 0 and await self._restored_state_is_bad(step, message.get("loss")):
            return False
        self._context.metrics.steps.inc()
        self._context.metrics.step.set(step)
        await self._context.report(
            messages.Progress(
                generation=self._generation,
                step=step,
                loss=message.get("loss"),
                work=message.get("work"),
                core=message.get("core"),
            )
        )
        return True

    async def _checkpoint_failed(self, now: float, message: dict[str, Any]) -> None:
        self._detector.activity(now)
        during = message.get("during", "save")
        if during == "save":
            # The metric's labels are the tiers: a tier a workload makes up adds none (counted as local,
            # as the report below says).
            tier = message.get("tier")
            self._context.metrics.checkpoint_failures.labels(
                tier=tier if tier in set(Tier) else Tier.LOCAL
            ).inc()
        await self._context.report(
            messages.CheckpointInvalid(
                step=int(message["step"]),
                tier="local",
                reason="save failed" if during == "save" else "corrupt",
                detail=message.get("reason", ""),
            )
        )
        self._context.say(f"checkpoint of step {message['step']} failed: {message.get('reason')}")

    async def _restored_state_is_bad(self, step: int, loss: Any) -> bool:
        """The first steps after a restore must give a finite loss, or the restored step is bad."""
        self._sanity_left -= 1
        if loss is None or math.isfinite(float(loss)):
            return False
        self._sanity_left = 0
        detail = f"loss {loss} at step {step}, right after restoring step {self._restored_step}"
        await self._context.report(
            messages.Fault(
                generation=self._generation,
                kind=FaultKind.NONFINITE_LOSS,
                detail=detail,
                invalid_step=self._restored_step,
            )
        )
        return True
