"""How a supervisor reaches its job's leader, and what it does when it cannot.

Locally (`slicekeeper run`) the leader is a process on the same machine, started with the others:
it answers within seconds or the run is broken, so a supervisor that cannot reach it within
`LOCAL_WAIT_SECONDS` gives up with the error (exit 1).

In a pod the leader is another pod (slice 0, worker 0), reached by its name through the job's
headless Service. Neither a name that does not resolve yet (a cluster's DNS serves a new pod's name
some time after the pod got its IP) nor a leader that is not listening yet (its pod scheduled later,
its image still pulling, its node being replaced) says anything about the job: the pod keeps trying,
resolving the name again at every attempt, with a growing pause (at most `MAX_PAUSE_SECONDS`).

How long: `spec.health.replacementTimeoutSeconds`, the time the leader itself gives a lost host's new
pod to join before its policy carries on without that host (scale-down). A pod still cut off after
that is of no use to the job as it is, and no proof that the job failed either, so it asks for a new
pod: it exits `LEADER_UNREACHABLE_EXIT_CODE`, its last log line saying why. The operator
(operator/handlers.py) reads that exit code from the pod's status and replaces the pod without
blaming its node (nothing says the node is at fault), so a fresh pod, with a fresh IP, takes the
host's place and tries again; only exit 1 means "the job failed". The exit code is the whole
message: an annotation written first would race the exit (the operator would replace the pod before
it knew why).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from slicekeeper import protocol

LEADER_UNREACHABLE_EXIT_CODE = protocol.EXIT_LEADER_UNREACHABLE
"""In a pod: the leader could not be reached within spec.health.replacementTimeoutSeconds; replace
this pod (the operator reads exit 1 alone as "the job failed")."""
LOCAL_WAIT_SECONDS = 60.0
"""Locally: how long a supervisor waits for the leader process of its own run."""
ATTEMPT_SECONDS = 5.0
"""One connection attempt at most: an address nobody answers at (a stale one) must not eat the wait."""
FIRST_PAUSE_SECONDS = 0.05
MAX_PAUSE_SECONDS = 2.0
REPORT_EVERY_SECONDS = 30.0
"""How often a supervisor still waiting says so on stderr (its pod's log)."""

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Connect(Protocol):
    def __call__(self, host: str, port: int) -> Awaitable[Streams]: ...


async def open_control_connection(host: str, port: int) -> Streams:
    """A connection whose lines may be as long as the leader's journal (protocol.CONTROL_LINE_LIMIT)."""
    return await asyncio.open_connection(host, port, limit=protocol.CONTROL_LINE_LIMIT)


class LeaderUnreachable(OSError):
    """The leader did not answer within the wait; the last attempt's error is the cause."""


@dataclass(frozen=True)
class Clock:
    """The time and the pause between attempts (tests fake both)."""

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep


async def connect(
    host: str,
    port: int,
    *,
    wait: float,
    clock: Clock = Clock(),
    open_connection: Connect = open_control_connection,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> Streams:
    """Connect to the leader at `host:port`, trying again (the name resolved anew each time) until
    `wait` seconds have passed; then LeaderUnreachable."""
    started = clock.now()
    pause, next_report = FIRST_PAUSE_SECONDS, started
    while True:
        attempt = min(ATTEMPT_SECONDS, max(started + wait - clock.now(), FIRST_PAUSE_SECONDS))
        try:
            return await asyncio.wait_for(open_connection(host, port), attempt)
        except OSError as error:  # the name not resolved (gaierror), refused, timed out
            waited = clock.now() - started
            if waited + pause > wait:
                raise LeaderUnreachable(
                    f"leader {host}:{port} unreachable for {waited:.0f} s: {error!r}"
                ) from error
            if clock.now() >= next_report:
                say(f"leader {host}:{port} not reachable yet ({error!r}); trying {wait - waited:.0f} s more")
                next_report = clock.now() + REPORT_EVERY_SECONDS
            await clock.sleep(pause)
            pause = min(2 * pause, MAX_PAUSE_SECONDS)


async def reach_leader(
    host: str, port: int, *, in_pod: bool, replacement_timeout: float | None, machine: str
) -> Streams:
    """The supervisor's connection to its leader. In a pod, one that cannot be made within
    `replacement_timeout` ends the process with LEADER_UNREACHABLE_EXIT_CODE (see the module doc);
    locally, LeaderUnreachable propagates."""

    def say(line: str) -> None:
        print(f"[{machine}] {line}", file=sys.stderr, flush=True)

    if not in_pod or replacement_timeout is None:
        return await connect(host, port, wait=LOCAL_WAIT_SECONDS, say=say)
    try:
        return await connect(host, port, wait=replacement_timeout, say=say)
    except LeaderUnreachable as unreachable:
        say(
            f"{unreachable} (spec.health.replacementTimeoutSeconds: {replacement_timeout:g} s): "
            f"exit {LEADER_UNREACHABLE_EXIT_CODE}, asking for a new pod"
        )
        # SystemExit: the supervisor has nothing to wind down yet (no workload, no member state),
        # and its entry point (supervisor/__main__.py) knows exit codes only from run()'s result.
        raise SystemExit(LEADER_UNREACHABLE_EXIT_CODE) from unreachable
