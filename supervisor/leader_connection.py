"""How a supervisor reaches its job's leader, and what it does when it cannot.

The job's lease (supervisor.leader.election) names the leader and the address its server listens
at, so a supervisor needs no name service to find it: it waits for the lease to name a leader of the
term it followed or a newer one, connects, and, if that leader does not answer, tries again unless
a newer leader is elected meanwhile.

How long: locally (`slicekeeper run`) the leader is a process on the same machine, elected within
seconds, or the run is broken: after `LOCAL_WAIT_SECONDS` the supervisor gives up (exit 1). In a pod,
`spec.health.replacementTimeoutSeconds`, the time a leader gives a lost host's new pod to join
before its policy carries on without that host. A pod still cut off after that is of no use to the
job as it is, and no proof that the job failed either, so it asks for a new pod: it exits
`LEADER_UNREACHABLE_EXIT_CODE`, its last log line saying why. The operator (operator/pod_actions.py)
reads that exit code from the pod's status and replaces the pod without blaming its node (nothing
says the node is at fault); only exit 1 means "the job failed". The exit code is the whole message:
an annotation written first would race the exit (the operator would replace the pod before it knew
why).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from slicekeeper.supervisor.leader.election import Lease
from slicekeeper.supervisor.tls import JobTls

from slicekeeper import protocol

LEADER_UNREACHABLE_EXIT_CODE = protocol.EXIT_LEADER_UNREACHABLE
"""In a pod: no leader could be reached within spec.health.replacementTimeoutSeconds; replace this
pod (the operator reads exit 1 alone as "the job failed")."""
LOCAL_WAIT_SECONDS = 60.0
"""Locally: how long a supervisor waits for a leader of its own run."""
ATTEMPT_SECONDS = 5.0
"""One connection attempt at most: an address nobody answers at must not eat the wait."""
RETRY_PAUSE_SECONDS = 0.5
"""A leader that does not answer is tried again after this long, unless a newer one is elected."""

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Connect(Protocol):
    def __call__(self, host: str, port: int) -> Awaitable[Streams]: ...


class Leases(Protocol):
    def __call__(self, *, newer_than: int, timeout: float) -> Awaitable[Lease | None]: ...


class ReceivedFirst(asyncio.StreamReader):
    """A leader connection's reader that hands out every line the connection brought before it ended,
    however it ended. asyncio's own raises the error a connection broke off with (a reset, a broken
    pipe) before the lines it still holds, and a leader killed while its member is busy (stopping its
    workload) breaks off just so, once the member's report to it is refused: the journals it wrote
    after the stop (the decision, a hot-swap's assignment) would go with it, and the next leader would
    carry on without them. Here such an end is an end like a clean one, after the lines received."""

    def set_exception(self, exc: Exception) -> None:
        if isinstance(exc, OSError):  # ssl.SSLError and TimeoutError are OSErrors too
            self.feed_eof()
        else:
            super().set_exception(exc)


async def open_control_connection(
    host: str, port: int, tls: JobTls | None = None, limit: int = protocol.CONTROL_LINE_LIMIT
) -> Streams:
    """A connection whose lines may be as long as the leader's journal (`limit`: a relay's are a
    frame's header longer), with the job's credentials (`tls`; None: plain TCP, in unit tests), read
    by `ReceivedFirst`."""
    loop = asyncio.get_running_loop()
    reader = ReceivedFirst(limit=limit, loop=loop)
    stream = asyncio.StreamReaderProtocol(reader, loop=loop)
    options = {} if tls is None else tls.client_options()
    transport, _ = await loop.create_connection(lambda: stream, host, port, **options)
    return reader, asyncio.StreamWriter(transport, stream, reader, loop)


class LeaderUnreachable(OSError):
    """No leader answered within the wait; says whom it tried."""


async def reach_leader(
    leases: Leases,
    *,
    term: int,
    wait: float,
    open_connection: Connect = open_control_connection,
    now: Callable[[], float] = time.monotonic,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int, str]:
    """A connection to the leader the lease names, of term `term` or newer, its term and address.
    LeaderUnreachable once `wait` seconds passed without one."""
    give_up = now() + wait
    tried = "the job's lease names no leader"
    lease = await leases(newer_than=term - 1, timeout=wait)
    while lease is not None and lease.leader is not None:
        holder = lease.leader
        host, port = holder.address.rsplit(":", 1)
        with contextlib.suppress(OSError, TimeoutError):
            reader, writer = await asyncio.wait_for(open_connection(host, int(port)), ATTEMPT_SECONDS)
            return reader, writer, lease.term, holder.address
        tried = f"the leader of term {lease.term}, {holder.machine} at {holder.address}, does not answer"
        if now() >= give_up:
            break
        # A newer leader, or the same one again after a pause.
        newer = await leases(newer_than=lease.term, timeout=min(RETRY_PAUSE_SECONDS, give_up - now()))
        lease = newer or lease
    raise LeaderUnreachable(f"no leader reachable within {wait:g} s: {tried}")
