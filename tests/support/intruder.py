"""A process that is not one of a job's supervisors talking to their ports: in plain TCP, in TLS
without a certificate, or in TLS with another job's certificate. What it gets back is what a tenant
sharing the cluster would get."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
from pathlib import Path

from slicekeeper import credentials

TIMEOUT = 10.0


def fetch_request(owner: int, step: int) -> bytes:
    """A peer-tier fetch of a host's shard."""
    return json.dumps({"op": "fetch", "owner": owner, "step": step}).encode() + b"\n"


def push_request(owner: int, step: int) -> bytes:
    """A peer-tier push of a (poisoned) shard: the header, a manifest, one file's bytes."""
    manifest = json.dumps(
        {"step": step, "shards": [{"name": "w", "file": "w.npy", "size": 4, "sha256": "0" * 64}]}
    ).encode()
    header = {"op": "push", "owner": owner, "step": step, "manifest": len(manifest)}
    return json.dumps(header).encode() + b"\n" + manifest + b"evil"


def leader_message() -> bytes:
    """A leader-protocol message claiming host 1's identity, then a Watch."""
    register = {"type": "register", "host": 1, "metrics_port": 1, "pid": os.getpid(), "machine": "evil"}
    return json.dumps(register).encode() + b"\n" + b'{"type": "watch"}\n'


def plain(port: int, payload: bytes) -> bytes:
    """Send `payload` in the clear; whatever comes back before the connection ends."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        return _exchange(sock, payload)


def tls(port: int, payload: bytes, certificate: Path | None, *, first_line: bool = False) -> bytes:
    """Send `payload` over TLS, showing the credentials in `certificate` (a directory) or none, and
    trusting any server: what is tested is whether the server accepts this client. `first_line`:
    stop reading at the first line (a connection that stays open, like a watcher's)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if certificate is not None:
        context.load_cert_chain(
            str(certificate / credentials.CERT_FILE), str(certificate / credentials.KEY_FILE)
        )
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw:
        try:
            sock = context.wrap_socket(raw)
        except (ssl.SSLError, OSError):
            return b""  # refused during the handshake
        with sock:
            return _exchange(sock, payload, first_line)


def _exchange(sock: socket.socket, payload: bytes, first_line: bool = False) -> bytes:
    received = b""
    with contextlib.suppress(OSError):  # reset, or the TLS alert of a refused certificate
        sock.sendall(payload)
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            received += chunk
            if len(received) > 1 << 20 or (first_line and b"\n" in received):
                break
    return received


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (from /proc: its sockets' inodes in the LISTEN state)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
