"""The operator replicas' election settings (operator/leader_election.py): client-go's timing ratios,
a lease too short refused with the flag named, and a standby's liveness answer on kopf's endpoint."""

from __future__ import annotations

import urllib.request

import pytest
from slicekeeper.operator.leader_election import standby_liveness, timing
from slicekeeper.supervisor.ports import free_port

from slicekeeper import cli


def test_the_timing_keeps_client_gos_ratios_and_the_librarys_floor():
    assert timing(15) == (15, 10.0, 2.0)
    assert timing(3) == (3, 2.0, 1.0)  # the retry never under the library's 1 s
    with pytest.raises(ValueError, match="at least 3 s"):
        timing(2)


def test_a_lease_too_short_is_refused_naming_the_flag(capsys: pytest.CaptureFixture[str]):
    code = cli.main(["operator", "--server", "http://127.0.0.1:1", "--metrics-port", "0",
                     "--leader-election", "--leader-election-lease-seconds", "2"])  # fmt: skip
    assert code != 0
    assert "--leader-election-lease-seconds: a lease of 2 s: at least 3 s" in capsys.readouterr().err


def test_a_standby_answers_the_liveness_probe_and_frees_the_port_for_kopf():
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/healthz"
    with standby_liveness(endpoint), urllib.request.urlopen(endpoint, timeout=5) as answer:
        assert answer.status == 200 and b"standby" in answer.read()
    with standby_liveness(endpoint):  # the port is free again at once (kopf binds it next)
        pass
