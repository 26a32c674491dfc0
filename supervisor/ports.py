"""Free ports for a local run's listeners, taken from outside the kernel's ephemeral range.

A port the kernel hands out for `bind(("", 0))` lies in its ephemeral range, the same range it draws
source ports from. A client that retries against such a port before its server listens can be given
that very port as its own source port and connect to itself (TCP simultaneous open): it then reads
its own request back, and holds the port, so the server's bind fails. Ports below the range are never
source ports, so a listener that comes up late is only refused, never impersonated.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10_000
"""Below this lie well-known and registered services' usual ports."""
DEFAULT_EPHEMERAL_START = 32_768


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's default where it cannot be read)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_START


def free_port_block(size: int, address: str = "127.0.0.1", attempts: int = 200) -> int:
    """A port P below the ephemeral range such that P .. P+size-1 can all be bound on `address` now."""
    top = ephemeral_start() - size
    if top <= LOWEST:
        raise RuntimeError(f"no room for {size} ports between {LOWEST} and the ephemeral range")
    for _ in range(attempts):
        base = random.randrange(LOWEST, top)
        held: list[socket.socket] = []
        try:
            for port in range(base, base + size):
                sock = socket.socket()
                held.append(sock)
                sock.bind((address, port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no block of {size} free ports below {ephemeral_start()} on {address}")


def free_port(address: str = "127.0.0.1") -> int:
    """One free port below the ephemeral range."""
    return free_port_block(1, address)
