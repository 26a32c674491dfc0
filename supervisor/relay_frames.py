"""The lines on a relay's one connection to the leader: many members' connections in one.

A relay (supervisor.host.relay) carries the connections of a group of hosts' supervisors to the leader
over a single connection of its own, so that the leader holds one connection per group instead of one
per host (issue 41: at 25,000 hosts, a few hundred). Each member's connection is a numbered channel;
every line on the relay's connection is one of a channel's lines, prefixed with the channel:

    relay -> leader   <c> +             a member connected (channel c opens)
                      <c> <line>        one of its lines, as it sent it
                      <c> -             its connection ended (c closes)
                      <c> -silent       ... at its deadline of silence (supervisor.connection_deadline)
    leader -> relay   <c> <line>        a command for that member
                      <c1>,<c2>,... <line>   the same command for several (written once)
                      <c> -             the leader dropped that member: the relay closes its connection

The first line of the connection is the relay's greeting (messages.RelayHello), a message as any
other. A member's lines are never parsed here: the leader reads them as it reads a member's own
connection, and the relay passes them on as they came.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

OPEN: Final = b"+"
END: Final = b"-"
SILENT: Final = b"-silent"
CONTROLS: Final = (OPEN, END, SILENT)
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
    parts = header.split(b",")
    if len(parts) > MAX_CHANNELS_PER_LINE or not all(part.isdigit() for part in parts):
        raise FrameError(f"not a relay frame's channels: {header[:80]!r}")
    payload = rest[:-1] if rest[:-1] in CONTROLS else rest
    if payload == b"\n":
        raise FrameError(f"an empty line for channel(s) {header[:80]!r}")
    return Frame(tuple(int(part) for part in parts), payload)
