"""Silent partitions, the parts: a connection's deadline ends what a partition leaves open, the
partition drops packets both ways without closing anything, and a leader tells a lost member from
being cut off itself."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest
from slicekeeper.supervisor import connection_deadline
from slicekeeper.supervisor.host import partition
from slicekeeper.supervisor.leader.silence import Silence

needs_nftables = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("nft") is None, reason="a partition takes root and nftables' nft"
)

GROUP = partition.GROUP_ID_BASE + 999
RUN = "tests/silent-partitions"

PEER = """
import socket, sys, time
from slicekeeper.supervisor import connection_deadline
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
connection_deadline.impose(sock, float(sys.argv[2]))
print("connected", flush=True)
begun = None
try:
    while data := sock.recv(64):
        if begun is None:
            begun = time.monotonic()
        print("got", data.decode(), flush=True)
    print("closed", flush=True)
except OSError as error:
    print("failed", type(error).__name__, flush=True)
"""


class Peer:
    """A process under its own group id, connected to a server in this one: the machine cut off."""

    def __init__(self, deadline: float) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        port = self.server.getsockname()[1]
        self.process = subprocess.Popen(
            [sys.executable, "-c", PEER, str(port), str(deadline)],
            stdout=subprocess.PIPE,
            text=True,
            group=GROUP,
        )
        self.sock, _ = self.server.accept()
        connection_deadline.impose(self.sock, deadline)
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "connected"
        self.table = partition.table_name(RUN, f"peer-{self.process.pid}")

    def says(self, text: str) -> str:
        self.sock.sendall(text.encode())
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def read_until(self, seconds: float) -> tuple[str, float]:
        """What a read on this side met within `seconds`, and when."""
        self.sock.settimeout(seconds)
        begun = time.monotonic()
        try:
            data = self.sock.recv(64)
            return ("closed" if not data else "data"), time.monotonic() - begun
        except TimeoutError as error:
            # socket.timeout (no answer within `seconds`) and ETIMEDOUT (the deadline) are both
            # TimeoutError: told apart by errno.
            outcome = "deadline" if error.errno is not None else "nothing"
            return outcome, time.monotonic() - begun

    def close(self) -> None:
        partition.heal(self.table)
        self.process.kill()
        self.process.wait()
        self.sock.close()
        self.server.close()


@needs_nftables
def test_a_partitioned_connection_fails_on_both_sides_within_its_deadline():
    peer = Peer(deadline=2.0)
    try:
        assert peer.says("before") == "got before"
        partition.cut(peer.table, GROUP, peer.process.pid)
        peer.sock.sendall(b"lost")  # data in flight: the user timeout, not only keepalive, ends it
        outcome, seconds = peer.read_until(10.0)
        assert outcome == "deadline" and 1.5 < seconds < 5.0
        assert peer.process.stdout is not None
        assert peer.process.stdout.readline().strip() == "failed TimeoutError"
    finally:
        peer.close()


@needs_nftables
def test_negative_control_without_a_deadline_the_partition_goes_unnoticed_and_closes_nothing():
    peer = Peer(deadline=0.0)
    try:
        partition.cut(peer.table, GROUP, peer.process.pid)
        outcome, _ = peer.read_until(4.0)
        assert outcome == "nothing"  # no error, no FIN, no reset: the connection looks open
        peer.sock.sendall(b"later")
        partition.heal(peer.table)
        assert peer.process.stdout is not None
        assert peer.process.stdout.readline().strip() == "got later"  # retransmitted once healed
    finally:
        peer.close()


@needs_nftables
def test_a_run_leaves_no_partition_behind():
    peer = Peer(deadline=0.0)
    other = partition.table_name("another run", "host-1")
    idle = subprocess.Popen(["sleep", "60"])  # a machine of another run, with no socket
    try:
        partition.cut(peer.table, GROUP, peer.process.pid)
        partition.cut(other, GROUP + 1, idle.pid)
        assert partition.remove_all(RUN) == [peer.table]
        assert peer.says("healed") == "got healed"
        assert partition.remove_all("another run") == [other]
    finally:
        partition.heal(other)
        idle.kill()
        idle.wait()
        peer.close()


def test_the_rules_drop_what_the_machine_sends_and_what_is_sent_to_it():
    sockets = partition.Sockets(
        connections=frozenset({("127.0.0.1", 40000, "127.0.0.1", 5000)}), ports=frozenset({6000, 6001})
    )
    rules = partition.rules("t", 61003, sockets)
    assert "meta skgid 61003 drop" in rules
    assert (
        "ip saddr . tcp sport . ip daddr . tcp dport { 127.0.0.1 . 5000 . 127.0.0.1 . 40000 } drop" in rules
    )
    assert "tcp dport { 6000, 6001 } drop" in rules


def test_the_deadline_is_the_kernels_keepalive_and_user_timeout():
    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname()) as sock:
            connection_deadline.impose(sock, 5.0)
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 5000
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 1
        with socket.create_connection(server.getsockname()) as sock:
            connection_deadline.impose(sock, 0)
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0


# --- the leader: a member lost, or itself cut off ---------------------------------------------------


async def silent_ends(silence: Silence, ended: list[int], live: list[int]) -> list[bool]:
    """The connections of the hosts `ended` end silently, 0.1 s apart; those of `live` stay."""
    members = [(host, f"connection of host {host}") for host in [*ended, *live]]

    async def one(index: int, host: int) -> bool:
        await asyncio.sleep(0.1 * index)
        return await silence.cut_off_after(f"connection of host {host}", lambda: members)

    return list(await asyncio.gather(*(one(i, host) for i, host in enumerate(ended))))


def test_a_leader_whose_members_all_went_silent_is_the_one_cut_off():
    silence = Silence(deadline=0.2)
    silence.grace = 0.5
    assert asyncio.run(silent_ends(silence, [1, 2, 3], [])) == [True] * 3
    assert silence.cut_off and "heard no member for 0.2 s" in silence.reason()


def test_negative_control_a_member_went_silent_while_another_talks_on():
    silence = Silence(deadline=0.2)
    silence.grace = 0.5
    assert asyncio.run(silent_ends(silence, [2], [1, 3])) == [False]
    assert not silence.cut_off


def test_the_leaders_own_host_is_not_heard_for_the_others():
    """Its connection never leaves the machine: that it still talks says nothing of the network."""
    silence = Silence(deadline=0.2)
    silence.grace, silence.own_host = 0.5, 1
    assert asyncio.run(silent_ends(silence, [0, 2], [1])) == [True, True]


def test_the_grace_grows_with_the_deadline():
    assert Silence(2.0).grace == 2.0 and Silence(30.0).grace == 15.0
