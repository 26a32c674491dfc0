"""A silent network partition of one machine of a local run: nftables rules that drop its packets.

Chaos `partition:host=H[,seconds=T]@step=S` (slicekeeper.chaos) cuts the machine serving host H off
from every other machine without closing anything: no FIN, no reset, its processes run on, and every
packet it sends or is sent is dropped, so that the kernel's retransmissions and keepalive probes go
unanswered as across a dead link. After T seconds the rules go and the partition heals.

How: every machine of a run that has a partition fault runs under a group id of its own
(supervisor.local.local_runtime starts it so), and one nftables table per cut machine, in the output hook
that every packet of a local run passes (they all travel over loopback), drops
- what the machine's sockets send, matched by that group id (`meta skgid`): a connection it opens
  later never gets past its first SYN;
- what is sent to it, matched by the ports its sockets hold when it is cut: the exact connection
  (source and destination address and port) for each one it has open, the port for each it listens
  on (its workload's sockets included: its collectives stall too).

How it differs from a real partition:
- the machine still reads and writes the run's files: the lease (so a leader cut off still holds it,
  as a leader that still reaches the API server does, the case supervisor.leader.silence is for) and
  the checkpoint folders;
- its connections to itself are cut too (a real host keeps its loopback);
- a port it starts listening on after the cut gets a SYN through (not in the rules), and UDP is not
  cut (the supervisors and gloo speak TCP).
It needs root and nftables' `nft` (Debian's nftables package); `slicekeeper run` refuses a partition
fault without them (`check_available`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

import psutil

from slicekeeper.errors import UserError

TABLE_PREFIX = "slicekeeper_cut_"
"""Every partition's nftables table starts so (`remove_all` finds a run's leftovers by it)."""

GROUP_ID_BASE = 61000
"""Machine i of a run with a partition fault runs under group id GROUP_ID_BASE + i."""

NFT_SECONDS = 10.0


def check_available() -> None:
    """UserError unless this process may add nftables rules (root, and `nft` installed)."""
    if os.geteuid() != 0:
        raise UserError("--chaos partition: dropping a machine's packets takes root (nftables rules)")
    if shutil.which("nft") is None:
        raise UserError("--chaos partition: needs nftables' `nft` (Debian: apt-get install nftables)")


def table_name(run: str, machine: str) -> str:
    """The nftables table of `machine`'s partition in the run `run` (letters, digits and _ only)."""
    return _run_prefix(run) + re.sub(r"[^A-Za-z0-9_]", "_", machine)


def _run_prefix(run: str) -> str:
    return f"{TABLE_PREFIX}{hashlib.sha256(run.encode()).hexdigest()[:12]}_"


@dataclass(frozen=True)
class Sockets:
    """A machine's TCP sockets when it is cut: the (local, remote) address pairs of its connections,
    and the ports it listens on (or holds bound)."""

    connections: frozenset[tuple[str, int, str, int]]
    ports: frozenset[int]


def sockets_of(pid: int) -> Sockets:
    """The TCP sockets of process `pid` and of every process under it (its workload, standby)."""
    root = psutil.Process(pid)
    connections: set[tuple[str, int, str, int]] = set()
    ports: set[int] = set()
    for process in [root, *root.children(recursive=True)]:
        try:
            opened = process.net_connections(kind="tcp4")
        except psutil.NoSuchProcess:
            continue
        for socket in opened:
            if socket.raddr:
                connections.add((socket.laddr.ip, socket.laddr.port, socket.raddr.ip, socket.raddr.port))
            elif socket.laddr:
                ports.add(socket.laddr.port)
    return Sockets(frozenset(connections), frozenset(ports))


def rules(table: str, group_id: int, sockets: Sockets) -> str:
    """The nftables script that cuts the machine off (see the module docstring)."""
    lines = [
        f"table inet {table} {{",
        "  chain out {",
        "    type filter hook output priority -10; policy accept;",
        f"    meta skgid {group_id} drop",
    ]
    if sockets.connections:
        # Sent to the machine: the remote end of each of its connections is the source.
        ends = sorted(sockets.connections)
        tuples = ", ".join(f"{remote} . {rport} . {local} . {lport}" for local, lport, remote, rport in ends)
        lines.append(f"    ip saddr . tcp sport . ip daddr . tcp dport {{ {tuples} }} drop")
    if sockets.ports:
        lines.append(f"    tcp dport {{ {', '.join(str(port) for port in sorted(sockets.ports))} }} drop")
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def cut(table: str, group_id: int, pid: int) -> Sockets:
    """Cut the machine whose supervisor is process `pid` (running under `group_id`) off the network.
    RuntimeError with nft's own words when the rules are refused."""
    sockets = sockets_of(pid)
    _nft(["-f", "-"], rules(table, group_id, sockets))
    return sockets


def heal(table: str) -> None:
    """The partition ends: its rules go (nothing when there are none)."""
    if table in _tables():
        _nft(["delete", "table", "inet", table])


def remove_all(run: str) -> list[str]:
    """Every partition of `run` still in place removed (a run's end leaves no rule behind)."""
    prefix = _run_prefix(run)
    removed = [table for table in _tables() if table.startswith(prefix)]
    for table in removed:
        _nft(["delete", "table", "inet", table])
    return removed


def _tables() -> list[str]:
    listing = json.loads(_nft(["-j", "list", "tables", "inet"]) or "{}")
    return [entry["table"]["name"] for entry in listing.get("nftables", []) if "table" in entry]


def _nft(args: list[str], script: str | None = None) -> str:
    result = subprocess.run(
        ["nft", *args], input=script, capture_output=True, text=True, timeout=NFT_SECONDS, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"nft {' '.join(args)}: {result.stderr.strip() or f'exit {result.returncode}'}")
    return result.stdout
