"""The lines on a relay's one connection to the leader: many members' connections in one.

A relay (supervisor.host.relay) carries the connections of a group of hosts' supervisors to the leader
over a single connection of its own, so that the leader holds one connection per group instead of one
per host (issue 41: at 25,000 hosts, a few hundred). Each member's connection is a numbered channel;
every line on the relay's connection is one of a channel's lines, prefixed with the channel:

    relay -> leader   <c> +             a member connected (channel c opens)
                      <c> <line>        one of its lines, as it sent it
                      <c> -             its connection ended (c closes)
                      <c> -silent       ... at its deadline of silence (supervisor.connection_deadline)
    relay -> leader   <c1>,<c2>,... *[<line>,<line>,...]   the acknowledgements of a stop by the
                                        members of `c1`, `c2`, ... (one each, in that order),
                                        gathered by the relay into one line (`gathered`)
    leader -> relay   <c> <line>        a command for that member
                      <c1>,<c2>,... <line>   the same command for several (written once)
                      <c1>,<c2>,... *<bundle>   a command of its own for each of several, written
                                        as what they share and what is each one's (a start of
                                        every host: the world once, each host's rank and sources),
                                        which the relay makes into each member's line (`lines_of`)
                      <c> -             the leader dropped that member: the relay closes its connection

The first line of the connection is the relay's greeting (messages.RelayHello), a message as any
other. A member's lines are never parsed here: the leader reads them as it reads a member's own
connection, and the relay passes them on as they came.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from slicekeeper import protocol

OPEN: Final = b"+"
END: Final = b"-"
SILENT: Final = b"-silent"
CONTROLS: Final = (OPEN, END, SILENT)
CONTROL_BYTES: Final = max(len(control) for control in CONTROLS) + 1
"""A control with its newline is at most this long: a longer payload is a line (not copied to see)."""
BUNDLE: Final = b"*"
"""The start of a bundle's payload: `*{"common": {...}, "each": [{...}, ...]}`, `each` in the order of
the frame's channels."""
MAX_CHANNELS_PER_LINE: Final = 100_000
"""A header naming more channels than any relay serves is not a frame."""


class FrameError(ValueError):
    """A line on a relay's connection that is not a frame."""


@dataclass(frozen=True)
class Frame:
    channels: tuple[int, ...]
    payload: bytes
    """A member's line (with its newline), or one of CONTROLS (without)."""

    @property
    def control(self) -> bytes | None:
        """OPEN, END or SILENT; None for a member's line."""
        return self.payload if self.payload in CONTROLS else None


def frame(channels: Iterable[int], line: bytes) -> bytes:
    """`line` (a whole line, or one of CONTROLS) for `channels`, as one line of the relay's connection."""
    header = ",".join(str(channel) for channel in channels)
    if not header:
        raise FrameError("a frame for no channel")
    if line in CONTROLS:
        return header.encode() + b" " + line + b"\n"
    if not line.endswith(b"\n") or b"\n" in line[:-1]:
        raise FrameError(f"not one whole line: {line[:80]!r}")
    return header.encode() + b" " + line


def parse(line: bytes) -> Frame:
    """The frame on one line of a relay's connection (with its newline). FrameError for anything else."""
    header, space, rest = line.partition(b" ")
    if not space or not line.endswith(b"\n") or not header:
        raise FrameError(f"not a relay frame: {line[:80]!r}")
    if header.isdigit():  # one channel: most of a relay's lines
        channels: tuple[int, ...] = (int(header),)
    else:
        parts = header.split(b",")
        if len(parts) > MAX_CHANNELS_PER_LINE or not all(part.isdigit() for part in parts):
            raise FrameError(f"not a relay frame's channels: {header[:80]!r}")
        channels = tuple(map(int, parts))
    payload = rest[:-1] if len(rest) <= CONTROL_BYTES and rest[:-1] in CONTROLS else rest
    if payload == b"\n":
        raise FrameError(f"an empty line for channel(s) {header[:80]!r}")
    return Frame(channels, payload)


def bundle(channels: list[int], common: dict[str, Any], each: list[dict[str, Any]]) -> bytes:
    """One frame carrying a line of its own for each of `channels`: the line of `channels[i]` is
    `common` with `each[i]` over it (`lines_of` on the relay's side)."""
    if len(channels) != len(each):
        raise FrameError(f"a bundle of {len(each)} lines for {len(channels)} channels")
    payload = json.dumps({"common": common, "each": each}, separators=(",", ":")).encode()
    return frame(channels, BUNDLE + payload + b"\n")


def gathered(channels: list[int], lines: list[bytes]) -> bytes:
    """The lines of several members (one each, a whole JSON object line) as one frame."""
    if len(channels) != len(lines):
        raise FrameError(f"{len(lines)} lines gathered for {len(channels)} channels")
    return frame(channels, BUNDLE + b"[" + b",".join(line.rstrip(b"\n") for line in lines) + b"]\n")


def values_of(received: Frame) -> list[tuple[int, Any]]:
    """Each channel's message of a bundle, read (FrameError for a bundle that is not one): the
    leader's common fields with each member's own over them, or the members' gathered lines."""
    try:
        carried = json.loads(received.payload[len(BUNDLE) :])
    except ValueError as error:
        raise FrameError(f"not a bundle: {received.payload[:80]!r}") from error
    common: dict[str, Any] = {}
    each: Any = carried  # the members' gathered lines
    if isinstance(carried, dict) and isinstance(carried.get("common"), dict):
        common, each = carried["common"], carried.get("each")
    elif not isinstance(carried, list):
        raise FrameError(f"not a bundle: {received.payload[:80]!r}")
    if not isinstance(each, list) or len(each) != len(received.channels):
        raise FrameError(f"a bundle that does not give each of {len(received.channels)} channels a line")
    if not all(isinstance(own, dict) for own in each):
        raise FrameError("a bundle whose lines are not objects")
    return [(channel, common | own) for channel, own in zip(received.channels, each, strict=True)]


def lines_of(received: Frame) -> list[tuple[int, bytes]]:
    """Each channel's line: the payload itself for every channel of a plain frame; a bundle's own
    line for each (FrameError for a bundle that is not one)."""
    if not received.payload.startswith(BUNDLE):
        return [(channel, received.payload) for channel in received.channels]
    return [(channel, protocol.encode(value)) for channel, value in values_of(received)]
