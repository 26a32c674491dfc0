"""Ports for a local run's listeners come from below the kernel's ephemeral range, where no client's
source port can land (a client retrying against a late listener would otherwise connect to itself)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from slicekeeper.supervisor import ports
from slicekeeper.supervisor.metrics import SupervisorMetrics

from slicekeeper.goodput import GoodputAccountant


def test_every_port_handed_out_lies_below_the_ephemeral_range():
    start = ports.ephemeral_start()
    for _ in range(50):
        base = ports.free_port_block(6)
        assert base >= ports.LOWEST and base + 6 <= start
    assert all(ports.LOWEST <= ports.free_port() < start for _ in range(50))


def test_the_kernels_own_choice_lies_in_the_range_that_is_avoided():
    """The negative control: a port from bind(0) is an ephemeral one, the kind free_port avoids."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        assert probe.getsockname()[1] >= ports.ephemeral_start()


def test_the_block_is_free_to_bind():
    base = ports.free_port_block(4)
    held = [socket.socket() for _ in range(4)]
    try:
        for offset, sock in enumerate(held):
            sock.bind(("127.0.0.1", base + offset))
    finally:
        for sock in held:
            sock.close()


def test_an_unreadable_range_falls_back_to_linuxs_default(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "missing")
    assert ports.ephemeral_start() == ports.DEFAULT_EPHEMERAL_START
    (tmp_path / "garbled").write_text("not numbers")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "garbled")
    assert ports.ephemeral_start() == ports.DEFAULT_EPHEMERAL_START


def test_a_metrics_port_in_use_is_named_in_the_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            SupervisorMetrics(lambda: GoodputAccountant(start=0.0)).serve(port)
