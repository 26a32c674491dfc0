"""A stop's acknowledgements by a relay's members, gathered into one line for the leader.

At a stop every host acknowledges with what its disk holds (messages.Stopped); a leader reading them
one by one, each a line of its own, took one round's start condition per relay's worth (and per
line, the parsing). A relay holds each acknowledgement of a stop it carried until every member it
told has acknowledged (or its connection ended, or GATHER_SECONDS passed) and sends them on together
in one frame (supervisor.relay_frames, `gathered`), which the leader reads at once and takes each
line of as its own member's.

A member's lines stay in their order: any other line of a member whose acknowledgement is held, and
its connection's end, send what is held on first.

Progress reports were gathered the same way for a while (held 50 ms): the leader's CPU at rest did
not move (5,000 hosts: 62 us a host-step either way; its time is in reading each report's steps and
scoring them, not in the lines' framing), so they go on as they come.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Iterable

from slicekeeper.supervisor.relay_frames import gathered

GATHER_SECONDS = 1.0
"""The longest an acknowledgement waits for the rest of its group's (a member that never answers:
the leader waits for it, STOP_ACK_SECONDS, and sees it lost on its own)."""
STOP = b'"type":"stop"'
"""A stop, as the leader encodes it (protocol.encode: no spaces)."""
STOPPED = b'"type":"stopped"'


def _generation(line: bytes) -> int | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    generation = value.get("generation") if isinstance(value, dict) else None
    return generation if isinstance(generation, int) else None


class AckGathering:
    """The acknowledgements of the stops a relay carried to its members, held until the group's are in."""

    def __init__(self, send: Callable[[bytes], None], wait: float = GATHER_SECONDS) -> None:
        """`send`: writes a frame to the leader, after those written before it."""
        self._send = send
        self._wait = wait
        self._awaited: dict[int, set[int]] = {}
        """generation -> the channels told to stop that have not acknowledged yet."""
        self._acks: dict[int, list[tuple[int, bytes]]] = {}
        """generation -> (channel, its acknowledgement) held, in the order they came."""
        self._holding: Counter[int] = Counter()
        """channel -> its acknowledgements held."""
        self._timers: dict[int, asyncio.TimerHandle] = {}
        """generation -> when its acknowledgements go on regardless."""

    def stop_sent(self, channels: Iterable[int], payload: bytes) -> None:
        """A line of the leader's to `channels`: a stop's acknowledgements are awaited from each."""
        if STOP not in payload or (generation := _generation(payload)) is None:
            return
        self._awaited.setdefault(generation, set()).update(channels)
        if generation not in self._timers:
            loop = asyncio.get_running_loop()
            self._timers[generation] = loop.call_later(self._wait, self._release, generation)

    def held(self, channel: int, line: bytes) -> bool:
        """A member's line: True when it is an awaited acknowledgement, now held; else (False) the
        caller sends it on, after any acknowledgement of the same member held before it."""
        if STOPPED in line and (generation := _generation(line)) is not None:
            awaited = self._awaited.get(generation, set())
            if channel in awaited:
                awaited.discard(channel)
                self._holding[channel] += 1
                self._acks.setdefault(generation, []).append((channel, line))
                if not awaited:
                    self._release(generation)
                return True
        if self._holding[channel]:
            self._release_all()
        return False

    def gone(self, channel: int) -> None:
        """The member's connection ended: no acknowledgement of it is awaited, and what it said that
        is held goes on before its end does."""
        if self._holding[channel]:
            self._release_all()
        for generation, awaited in list(self._awaited.items()):
            awaited.discard(channel)
            if not awaited and generation in self._acks:
                self._release(generation)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def _release_all(self) -> None:
        """Everything held goes on now, in the order each member said it."""
        for generation in list(self._acks):
            self._release(generation)

    def _release(self, generation: int) -> None:
        """The acknowledgements of `generation` held go on."""
        timer = self._timers.pop(generation, None)
        if timer is not None:
            timer.cancel()
        self._awaited.pop(generation, None)
        held = self._acks.pop(generation, [])
        if held:
            self._holding.subtract(channel for channel, _ in held)
            self._send(gathered([channel for channel, _ in held], [line for _, line in held]))
