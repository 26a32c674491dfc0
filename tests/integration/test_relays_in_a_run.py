"""A run whose hosts reach the leader through their group's relay (spec.controlPlane.relays) trains as
one without: a killed workload is found, the job restarts, and it ends with the fault-free
parameters. The SDK example's loop (its parameters after N steps known in advance), two groups of one
slice each: the first host of each slice relays its slice's members, the others relay nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.cli_runs import read_report, run_cli, sdk_loop_fingerprint, sdk_loop_job

STEPS = 40
CARRYING = "carrying its members to the leader at"


def relayed_run(
    tmp_path: Path, chaos: str, control: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    """`slicekeeper run` of the SDK loop, each slice a relay group (`control`: more of
    spec.controlPlane), with `chaos`: its report."""
    relays = {"controlPlane": {"relays": True, "hostsPerRelay": 2, **(control or {})}}
    job = sdk_loop_job(tmp_path / "job.yaml", steps=STEPS, **relays, **spec)
    report = tmp_path / "report.json"
    result = run_cli("run", str(job), "--report", str(report), "--chaos", chaos, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return read_report(report)


def test_hosts_behind_relays_recover_from_a_kill_with_the_fault_free_parameters(tmp_path: Path):
    report = relayed_run(tmp_path, "kill:host=1@step=12")
    assert report["restarts"] == {"crash": 1}
    assert report["params_fingerprint"] == sdk_loop_fingerprint(STEPS)
    logs = {
        host: (Path(report["run_dir"]) / f"host-{host}" / "supervisor.log").read_text() for host in range(4)
    }
    # Each host goes through its group's first relay, or the next when that one does not answer yet
    # (its supervisor not started: on a loaded machine, host 3's relay once carried host 3).
    relays = {host for host, log in logs.items() if CARRYING in log}
    assert {0, 2} <= relays, {host: log[-2000:] for host, log in logs.items()}
    assert all(f"relay of group {host // 2}: {CARRYING}" in logs[host] for host in relays)
    assert not any("lost the leader" in log for log in logs.values()), logs


def test_a_relays_host_lost_costs_that_host_alone_its_group_rejoins_through_the_next(tmp_path: Path):
    """Host 2 relays its slice (hosts 2 and 3); its machine is lost. Host 3's connection to the relay
    ends with it, and host 3 rejoins the leader through the next relay of its group (its own
    supervisor's) while the leader waits for the lost relay's members: host 2 alone is lost, and a
    spare takes it over."""
    report = relayed_run(tmp_path, "lose:host=2@step=12", local={"spares": 1})
    assert report["restarts"] == {"host_lost": 1}, report["restarts"]
    assert [(d["kind"], d["host"]) for d in report["detections"]] == [("host_lost", 2)], report["detections"]
    assert report["params_fingerprint"] == sdk_loop_fingerprint(STEPS)
    host_3 = (Path(report["run_dir"]) / "host-3" / "supervisor.log").read_text()
    assert f"relay of group 1: {CARRYING}" in host_3, host_3[-3000:]  # it relays its group now


def test_the_leaders_host_lost_only_the_lease_candidates_read_the_lease_the_others_ask_them(tmp_path: Path):
    """Two lease candidates (spec.controlPlane.leaseCandidates): host 0, the leader and its group's
    relay, and host 2. Host 0's machine is lost: host 2 takes the lease over, hosts 1 and 3 learn the
    new leader by asking the candidates, never by reading the lease, and host 1 rejoins through its
    group's next relay; the spare that takes host 0 over becomes a candidate as host 0 was."""
    report = relayed_run(tmp_path, "lose:host=0@step=12", control={"leaseCandidates": 2}, local={"spares": 1})
    assert report["params_fingerprint"] == sdk_loop_fingerprint(STEPS)
    [change] = report["leader_changes"]
    assert (change["from_host"], change["to_host"]) == (0, 2), change
    machines = {
        folder.name: read_report(folder / "report.json")
        for folder in Path(report["run_dir"]).glob("*-*")
        if (folder / "report.json").is_file()
    }
    requests = {name: machine.get("lease_requests") for name, machine in machines.items()}
    assert requests["host-1"] == requests["host-3"] == 0, requests
    assert requests["host-2"] > 0 and requests["spare-0"] > 0, requests  # a candidate once it is host 0


def test_the_leader_and_another_groups_relay_lost_at_once_end_with_the_fault_free_parameters(tmp_path: Path):
    """Hosts 0 (the leader, group 0's relay and a lease candidate) and 2 (group 1's relay and a
    candidate) lost at about the same step: another lease candidate takes the lease over (host 1, or
    host 2 once a spare serves it: a spare taking a candidate's host over becomes one, and on a fresh
    clone it won), each group goes on through another of its relays, two spares take hosts 0 and 2
    over, and the job ends as the fault-free run does."""
    report = relayed_run(tmp_path, "lose:host=0@step=12,lose:host=2@step=12", local={"spares": 2})
    assert report["params_fingerprint"] == sdk_loop_fingerprint(STEPS)
    [change] = report["leader_changes"]
    assert change["from_host"] == 0 and change["to_host"] in (1, 2), change
    assert sorted(report["hot_swaps"]["hosts"]) == [0, 2], report["hot_swaps"]
    run_dir = Path(report["run_dir"])
    for group, lost in ((0, "host-0"), (1, "host-2")):  # carried on by a relay other than the lost one
        carriers = [
            log.parent.name
            for log in run_dir.glob("*/supervisor.log")
            if f"relay of group {group}: {CARRYING}" in log.read_text()
        ]
        assert set(carriers) - {lost}, (group, carriers)
