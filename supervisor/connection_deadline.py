"""How long a connection between supervisors may carry nothing before it counts as dead.

A host whose network stops passing packets, without a FIN or a reset (a silent partition: a switch
gone, a cable pulled, a firewall dropping), leaves every connection to it "open" until TCP gives up on
its own, hours later by default: the leader would wait on it, and it on the leader, for that long.
Rather than a heartbeat of our own on every connection, the kernel's do the work, where they cost
the leader no Python at 25,000 members: keepalive probes on an idle connection, one every
`probe_seconds`, and TCP_USER_TIMEOUT, which ends a connection once what it sent (data or a probe)
has gone unacknowledged for the deadline. A live peer's kernel answers the probes even while its
process is busy (a long step, a restore), so only a dead link or a dead machine goes quiet.

The connection then fails with ETIMEDOUT (Python's TimeoutError) where the other side reads: the
leader handles that member as a lost host, or stands down if it hears no member at all (it is the
one cut off: supervisor.leader.Leader), and a member looks for the next leader.

The deadline is the job's `spec.health.connectionDeadlineSeconds` (0: none, TCP's own).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

PROBES_PER_DEADLINE = 4
"""Keepalive probes sent over a deadline of silence (at least one a second, the kernel's finest)."""


def probe_seconds(deadline: float) -> int:
    """Seconds between keepalive probes on an idle connection with this deadline."""
    return max(1, int(deadline / PROBES_PER_DEADLINE))


def impose(sock: Any, deadline: float) -> None:
    """Give the TCP socket `sock` (a socket, or asyncio's wrapper of one) a deadline of `deadline`
    seconds of silence; nothing for 0, or for a socket that is not TCP over IP (a unix socket)."""
    if deadline <= 0 or sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    probe = probe_seconds(deadline)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, probe)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, probe)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, max(1, round(deadline / probe)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(deadline * 1000))


def impose_on(writer: asyncio.StreamWriter, deadline: float) -> None:
    """`impose` on the socket under an asyncio stream (TLS or not)."""
    impose(writer.get_extra_info("socket"), deadline)
