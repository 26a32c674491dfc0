"""Silent partitions end to end: a machine cut off without a FIN or a reset is found within the job's
connection deadline, whether it is a member or the leader, and comes back when the partition heals.

The workload is the SDK example loop, whose hosts never talk to each other: a cut-off host trains on
where nobody hears it, and no hang gives the partition away, so only the connections' deadline can.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.support.cli_runs import processes_mentioning, run_job, sdk_loop_fingerprint
from tests.support.recovery_checks import problems

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("nft") is None, reason="chaos partition takes root and nftables' nft"
)

STEPS = 120  # 6 s of 50 ms steps: the partition at step 20 is found while the job still trains
DEADLINE = 2.0
HEALTH = {"connectionDeadlineSeconds": DEADLINE}


def detection_of(report: dict, host: int) -> dict:
    [fault] = [f for f in report["faults"] if f["kind"] == "partition"]
    assert fault["host"] == host
    return fault


def test_a_member_cut_off_is_lost_within_the_deadline_and_replaced(tmp_path):
    result, report = run_job(
        tmp_path, "--spares", "1", "--chaos", "partition:host=2@step=20", steps=STEPS, health=HEALTH
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert problems(report, fingerprint=sdk_loop_fingerprint(STEPS), steps=STEPS) == []
    fault = detection_of(report, 2)
    assert fault["detected_as"] == "host_lost"
    # The deadline, then the leader's grace to tell a lost member from being cut off itself.
    assert DEADLINE <= fault["detection_seconds"] <= DEADLINE + 2.0 + 3.0
    assert report["restarts"] == {"host_lost": 1} and report["hot_swaps"]["hosts"] == [2]
    assert [(d["kind"], d["host"]) for d in report["detections"]] == [("host_lost", 2)]
    assert report["leader_changes"] == []
    assert processes_mentioning(report["run_dir"]) == []


def test_a_leader_cut_off_stands_down_and_another_host_leads(tmp_path):
    result, report = run_job(
        tmp_path, "--spares", "1", "--chaos", "partition:host=0@step=20", steps=STEPS, health=HEALTH
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert problems(report, fingerprint=sdk_loop_fingerprint(STEPS), steps=STEPS) == []
    [change] = report["leader_changes"]
    assert (change["from_host"], change["from_machine"]) == (0, "host-0") and change["to_host"] != 0
    assert report["hot_swaps"]["hosts"] == [0] and report["restarts"] == {"host_lost": 1}
    assert detection_of(report, 0)["detected_as"] == "host_lost"
    assert "this leader is the one cut off" in _supervisor_log(report["run_dir"], "host-0")
    assert processes_mentioning(report["run_dir"]) == []


def test_a_partition_that_heals_lets_the_host_come_back(tmp_path):
    result, report = run_job(
        tmp_path, "--chaos", "partition:host=2,seconds=5@step=20", steps=STEPS, health=HEALTH
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert problems(report, fingerprint=sdk_loop_fingerprint(STEPS), steps=STEPS) == []
    assert detection_of(report, 2)["detected_as"] == "host_lost"
    assert "host 2 rejoined from host-2" in result.stdout
    assert report["hot_swaps"]["count"] == 0  # the same machine serves host 2 again


def test_negative_control_without_a_deadline_a_partition_goes_unnoticed(tmp_path):
    """The same partition, healing after 5 s, with no deadline: nobody notices, nothing restarts (its
    connections carry on once the packets pass again)."""
    result, report = run_job(
        tmp_path,
        "--chaos",
        "partition:host=2,seconds=5@step=20",
        steps=STEPS,
        health={"connectionDeadlineSeconds": 0},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert report["restarts"] == {} and report["detections"] == []
    assert detection_of(report, 2)["detected_as"] is None
    assert report["params_fingerprint"] == sdk_loop_fingerprint(STEPS)


def _supervisor_log(run_dir: str, machine: str) -> str:
    return (Path(run_dir) / machine / "supervisor.log").read_text()


def test_a_relay_cut_off_costs_its_own_host_alone_its_group_rejoins_through_the_next(tmp_path):
    """Host 2 relays its slice (spec.controlPlane.relays, a group per slice) and is cut off: the
    leader hears its relay's connection fall silent at the deadline and loses host 2 at once; host 3,
    its connection to the relay silent too, rejoins through its own supervisor's relay while the
    leader waits for the relay's members: one host lost, taken over by the spare."""
    relays = {"relays": True, "hostsPerRelay": 2}
    result, report = run_job(
        tmp_path,
        *("--spares", "1", "--chaos", "partition:host=2@step=20"),
        steps=STEPS,
        health=HEALTH,
        controlPlane=relays,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert report is not None
    assert problems(report, fingerprint=sdk_loop_fingerprint(STEPS), steps=STEPS) == []
    assert detection_of(report, 2)["detected_as"] == "host_lost"
    assert report["restarts"] == {"host_lost": 1} and report["hot_swaps"]["hosts"] == [2]
    assert [(d["kind"], d["host"]) for d in report["detections"]] == [("host_lost", 2)]
    assert processes_mentioning(report["run_dir"]) == []


RELAYED_16 = 200
"""Steps of the 16-host run: its three faults far enough apart (50 ms steps, hosts that do not wait
for each other) that each is found and recovered from in a generation of its own."""


def test_at_16_hosts_a_relays_workload_hung_its_host_lost_and_another_cut_off_end_fault_free(tmp_path):
    """16 hosts, 4 relay groups of 4 (two slices each; hosts 0, 4, 8 and 12 relay their groups). Host
    12's workload hangs (its relay carries on), host 4's machine is lost, host 8 is cut off: each is
    found (the hang, then each relay's loss as that host's), two spares take hosts 4 and 8 over, each
    lost relay's group goes on through its next host's relay, and the job ends as the fault-free run
    does."""
    result, report = run_job(
        tmp_path,
        *("--spares", "2", "--chaos", "hang:host=12@step=20,lose:host=4@step=100,partition:host=8@step=170"),
        steps=RELAYED_16,
        health=HEALTH,
        slices=8,
        local={"hosts": 16},
        controlPlane={"relays": True, "hostsPerRelay": 4},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert report is not None
    assert problems(report, fingerprint=sdk_loop_fingerprint(RELAYED_16), steps=RELAYED_16) == []
    found = {(f["kind"], f["host"]): f["detected_as"] for f in report["faults"]}
    assert found == {("hang", 12): "hang", ("lose", 4): "host_lost", ("partition", 8): "host_lost"}, found
    assert sorted(report["hot_swaps"]["hosts"]) == [4, 8]
    run_dir = Path(report["run_dir"])
    for host, group in ((5, 1), (9, 2)):  # the lost relay's group, through its next host's relay
        log = (run_dir / f"host-{host}" / "supervisor.log").read_text()
        assert f"relay of group {group}: carrying its members to the leader" in log, log[-3000:]
    assert processes_mentioning(report["run_dir"]) == []
