"""A stop's acknowledgements by a relay's members, gathered into one line for the leader.

At a stop every host acknowledges with what its disk holds (messages.Stopped); a leader reading
25,000 of them one by one, each a line of its own to parse and validate, spends a second of its
round on them (docs/benchmarks.md, "The critical path"). A relay sees the stop go to its members (one
frame for them all) and their acknowledgements come back: it holds each, and once every member it
told has acknowledged (or its connection ended, or GATHER_SECONDS passed), it sends them on together
in one frame (supervisor.relay_frames, `gathered`), which the leader reads at once and takes each
acknowledgement of as its own member's.

A member's lines stay in their order: any other line of a member whose acknowledgement is held, and
its connection's end, send the held acknowledgements on first.
"""

from __future__ import annotations

import asyncio
import json
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
        self._held: dict[int, list[tuple[int, bytes]]] = {}
        """generation -> (channel, its acknowledgement) held, in the order they came."""
        self._timers: dict[int, asyncio.TimerHandle] = {}

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
                self._held.setdefault(generation, []).append((channel, line))
                if not awaited:
                    self._release(generation)
                return True
        self._release_for(channel)
        return False

    def gone(self, channel: int) -> None:
        """The member's connection ended: no acknowledgement of it is awaited, and the ones held go on
        before its end does."""
        self._release_for(channel)
        for generation, awaited in list(self._awaited.items()):
            awaited.discard(channel)
            if not awaited and generation in self._held:
                self._release(generation)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def _release_for(self, channel: int) -> None:
        for generation, held in list(self._held.items()):
            if any(own == channel for own, _ in held):
                self._release(generation)

    def _release(self, generation: int) -> None:
        timer = self._timers.pop(generation, None)
        if timer is not None:
            timer.cancel()
        self._awaited.pop(generation, None)
        held = self._held.pop(generation, [])
        if held:
            self._send(gathered([channel for channel, _ in held], [line for _, line in held]))
