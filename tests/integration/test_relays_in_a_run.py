"""A run whose hosts reach the leader through their group's relay (spec.controlPlane.relays) trains as
one without: a killed workload is found, the job restarts, and it ends with the fault-free
parameters. The SDK example's loop (its parameters after N steps known in advance), two groups of one
slice each: the first host of each slice relays its slice's members, the others relay nothing.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.cli_runs import read_report, run_cli, sdk_loop_fingerprint, sdk_loop_job

STEPS = 40
CARRYING = "carrying its members to the leader at"


def test_hosts_behind_relays_recover_from_a_kill_with_the_fault_free_parameters(tmp_path: Path):
    job = sdk_loop_job(tmp_path / "job.yaml", steps=STEPS, controlPlane={"relays": True, "hostsPerRelay": 2})
    result = run_cli(
        "run",
        str(job),
        "--report",
        str(tmp_path / "report.json"),
        "--chaos",
        "kill:host=1@step=12",
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = read_report(tmp_path / "report.json")
    assert report["restarts"] == {"crash": 1}
    assert report["params_fingerprint"] == sdk_loop_fingerprint(STEPS)
    logs = {
        host: (Path(report["run_dir"]) / f"host-{host}" / "supervisor.log").read_text() for host in range(4)
    }
    relays = {host for host, log in logs.items() if CARRYING in log}
    assert relays == {0, 2}, {host: log[-2000:] for host, log in logs.items()}
    assert f"relay of group 0: {CARRYING}" in logs[0] and f"relay of group 1: {CARRYING}" in logs[2]
