"""TLS on every connection between a job's supervisors, and the refusal of everyone else.

A supervisor's servers (the leader's, the peer tier's) accept TCP connections in the clear and then
run the TLS handshake themselves (`accept`): a client without the job's certificate (no certificate,
another job's, plain text) fails it, before a byte of a message is read, and the refusal is counted
(`slicekeeper_refused_connections_total{port}`) and said once per peer address, so a scanner cannot
flood the log. Doing the handshake in the handler rather than in asyncio's server is what makes the
refusal visible: asyncio would only log it as an error of its own.

Its clients connect with the same credentials (`connect`). The job's credentials are
slicekeeper.credentials; this module only uses them.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import ssl
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slicekeeper import credentials

HANDSHAKE_SECONDS = 10.0
"""A client that has not completed the handshake by then is dropped (a slow or silent sender)."""
REMEMBERED_PEERS = 1024
"""Peer addresses whose refusal was said; past that many, refusals are only counted."""

TLS_READ_BUFFER_BYTES = 32 * 1024
"""What asyncio sets aside to read each TLS connection into (its own default is 256 KiB, allocated
whole when the connection is made): a leader of 5,000 members held 1.3 GB of them, measured by
benchmarks/control_plane_scale.py, and one of 25,000 would hold 6.4 GB. Two TLS records at most, so a
journal of megabytes is read in more, smaller reads; set for every TLS connection of the process."""
asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER_BYTES

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class JobTls:
    """The TLS contexts of one job's supervisor, made from the job's credentials directory, and the
    refusals its servers made."""

    def __init__(
        self,
        directory: Path,
        *,
        refused: Callable[[str], None] = lambda port: None,
        say: Callable[[str], None] = lambda text: print(text, file=sys.stderr, flush=True),
    ) -> None:
        """CredentialsError when `directory` holds no usable credentials. `refused(port)`: a
        connection to `port` ("leader", "peer") was refused (the metric); `say`: the log."""
        self.server = credentials.server_context(directory)
        self.client = credentials.client_context(directory)
        self._refused = refused
        self._say = say
        self._said: set[str] = set()

    async def accept(self, port: str, writer: asyncio.StreamWriter) -> bool:
        """The handshake on a connection just accepted by the `port` server: True when the client
        proved it belongs to the job; otherwise it is closed, counted and (once per peer) said."""
        raw = writer.transport
        peer = writer.get_extra_info("peername")
        try:
            await writer.start_tls(self.server, ssl_handshake_timeout=HANDSHAKE_SECONDS)
        except (OSError, TimeoutError, EOFError) as error:  # ssl.SSLError is an OSError
            self._refuse(port, raw, peer, error)
            return False
        except AttributeError:
            # CPython 3.11: a client that hangs up as the handshake ends leaves start_tls with no
            # transport (it fails setting it on the stream). The closed one is put back, so that the
            # writer can still be closed and collected.
            writer._transport = raw  # type: ignore[attr-defined]
            self._refuse(port, raw, peer, ConnectionResetError("the client hung up in the handshake"))
            return False
        return True

    def _refuse(self, port: str, raw: asyncio.BaseTransport, peer: object, error: BaseException) -> None:
        raw.abort()  # type: ignore[attr-defined]
        self._refused(port)
        address = str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)
        if address in self._said or len(self._said) >= REMEMBERED_PEERS:
            return
        self._said.add(address)
        why = "timed out" if isinstance(error, TimeoutError) else _reason(error)
        self._say(
            f"refused a connection from {address} to the {port} port: no valid credentials of this "
            f"job ({why}); further refusals from {address} are only counted"
        )

    async def connect(self, host: str, port: int, *, limit: int = 2**16) -> Streams:
        """A connection to another of the job's supervisors, both sides authenticated."""
        return await asyncio.open_connection(host, port, limit=limit, **self.client_options())

    def client_options(self) -> dict[str, Any]:
        """How a client connection to another of the job's supervisors is made (the TLS arguments of
        `loop.create_connection`): `connect`'s, for a caller that makes its own streams."""
        return {"ssl": self.client, "ssl_handshake_timeout": HANDSHAKE_SECONDS}


def _reason(error: BaseException) -> str:
    if isinstance(error, ssl.SSLError) and error.reason:
        return error.reason.lower().replace("_", " ")
    return str(error) or type(error).__name__
