"""Losing the leader's host costs a restart, never the job: the hand-over, end to end.

The leader runs in one host's supervisor (host 0 at the start). When that host is lost, another host
takes the job's lease (supervisor.leader.election), carries on the newest journal a member holds, and
treats host 0 like any lost host: a stop, the policy's decision (here: a spare takes over), the next
generation. When only host 0's supervisor process dies (chaos `crash-supervisor`), the runtime starts
it again on the same machine, the lease its predecessor held is released at once, and the restart is
a crash of host 0, restored from the disks every machine kept. Either way the job ends as if nothing
happened to its parameters, and the report shows the hand-over.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from tests.support.cli_runs import (
    ROOT,
    processes_mentioning,
    read_report,
    run_job,
    sdk_loop_fingerprint,
    sdk_loop_job,
    started_cli,
    supervisor_of,
)
from tests.support.recovery_checks import problems

STEPS = 40  # run_job's default
LOCKSTEP = ROOT / "tests" / "fixtures" / "lockstep_loop.py"
ELASTIC_STEPS = 100


def test_losing_the_leaders_host_hands_the_job_to_another_host(tmp_path, clean_fingerprint):
    result, report = run_job(tmp_path, "--spares", "1", "--chaos", "lose:host=0@step=15")
    assert result.returncode == 0, result.stderr[-3000:]
    assert problems(report, fingerprint=clean_fingerprint, steps=STEPS) == []
    assert report["restarts"] == {"host_lost": 1}
    assert report["hot_swaps"]["hosts"] == [0]
    [change] = report["leader_changes"]
    assert (change["from_host"], change["from_machine"], change["term"]) == (0, "host-0", 2)
    assert change["to_host"] in (1, 2, 3) and 0 < change["leaderless_seconds"] < 15
    # The lost host's fault fired once: the old leader journaled it before its machine vanished, so the
    # spare that took host 0 over does not fire it again.
    assert [f["kind"] for f in report["faults"]] == ["lose"]
    assert "leader change: host 0 -> host" in result.stdout
    assert processes_mentioning(report["run_dir"]) == []


def test_the_hosts_stalled_by_the_lost_leader_are_not_blamed(tmp_path):
    """In lockstep the other hosts fail with the lost one (their barrier is gone): the restart is still
    put down to the lost host, not to a crash of the hosts that noticed."""
    result, report = run_job(
        tmp_path,
        "--spares",
        "1",
        "--chaos",
        "lose:host=0@step=12",
        steps=24,
        workload={"command": [sys.executable, str(LOCKSTEP)]},
        checkpoint={"interval": 4, "persistent": None},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert report["restarts"] == {"host_lost": 1}
    assert len(report["leader_changes"]) == 1 and report["hot_swaps"]["hosts"] == [0]


def test_a_crashed_leader_supervisor_is_started_again_and_the_job_goes_on(tmp_path, clean_fingerprint):
    spec = "crash-supervisor:host=0@step=15"
    result, report = run_job(tmp_path, "--chaos", spec)
    assert result.returncode == 0, result.stderr[-3000:]
    assert problems(report, fingerprint=clean_fingerprint, steps=STEPS) == []
    assert report["restarts"] == {"crash": 1} and report["hot_swaps"]["count"] == 0  # the machine serves on
    [change] = report["leader_changes"]
    assert (change["from_host"], change["from_machine"]) == (0, "host-0") and change["term"] >= 2
    assert "host-0: its supervisor died (SIGKILL); starting it again on the same machine" in result.stdout
    # Fired once: the machine noted it before its supervisor died of it, so the next one on that
    # machine, which reaches step 15 again, does not fire it again.
    [fault] = report["faults"]
    assert (fault["kind"], fault["detected_as"]) == ("crash-supervisor", "crash")
    host_0 = Path(report["run_dir"]) / "host-0"
    assert json.loads((host_0 / "machine.json").read_text())["fired"] == [spec]
    # Both supervisors' accounts of host 0 count: the one that crashed and the one after it.
    assert report["hosts"][0]["machines"] == ["host-0", "host-0"]
    assert processes_mentioning(report["run_dir"]) == []


def test_a_crash_loop_that_loses_its_leader_midway_still_fails_after_exactly_its_restart_budget(tmp_path):
    """The budget lives in the job's memory, which the next leader carries on: killing the leader
    cannot buy a crash loop more restarts. Every start crashes (after 2 s, without a step); once the
    third generation started, host 0's supervisor (the leader) is killed; the runtime starts it again
    and a leader is elected again. The loss costs a restart of its own, and the budget of 3 still
    ends the job at the next crash."""
    crash_loop = [sys.executable, "-c", "import sys, time; time.sleep(2); sys.exit(3)"]
    job = sdk_loop_job(
        tmp_path / "job.yaml",
        workload={"command": crash_loop},
        health={"maxRestarts": 3, "maxRestartsWithoutProgress": 10},
    )
    report_path = tmp_path / "report.json"
    with started_cli("run", str(job), "--report", str(report_path)) as process:
        assert process.stdout is not None
        run_dir = None
        for line in process.stdout:
            if "run directory:" in line:
                run_dir = line.split("run directory:")[1].split()[0]
            if "generation 2 starting" in line:
                break
        assert run_dir is not None
        os.kill(supervisor_of(run_dir, 0), signal.SIGKILL)  # the leader, in the middle of the loop
        _, err = process.communicate(timeout=120)
    assert process.returncode == 1, err[-3000:]
    report = read_report(report_path)
    assert sum(report["restarts"].values()) == 3, report["restarts"]
    # Counted apart from the leaders' memory: the stops host 1 itself carried out, and the generations.
    host_1 = json.loads((Path(run_dir) / "host-1" / "report.json").read_text())
    assert sum(host_1["restarts"].values()) == 3, host_1["restarts"]
    assert report["generations"] == 4
    assert "restart budget spent: 3 in-job restarts (spec.health.maxRestarts)" in err
    [change] = report["leader_changes"]
    assert change["from_host"] == 0
    assert processes_mentioning(run_dir) == []


ELASTIC_AND_REMEMBERING = """
from slicekeeper.policy import Action, CapacityReturned, Context, Crash, Fail, HostLost, Ignore
from slicekeeper.policy import RestartInJob, ScaleDown, ScaleUp, Straggler


def on_host_lost(event: HostLost, context: Context) -> Action:
    return ScaleDown()


def on_crash(event: Crash, context: Context) -> Action:
    earlier = [d.event.kind for d in context.history]
    if earlier[:1] != ["host_lost"]:
        return Fail(reason=f"the history does not start with the scale-down: {earlier}")
    return RestartInJob()


def on_capacity_returned(event: CapacityReturned, context: Context) -> Action:
    return ScaleUp() if context.can_scale_up() else Ignore()


def on_straggler(event: Straggler, context: Context) -> Action:
    return Ignore()
"""
"""Scales down on a lost host, back up with capacity; restarts after a crash only if it remembers
the scale-down (a successor without the old leader's history fails the job)."""


def test_the_leader_lost_while_the_job_runs_scaled_down_leaves_its_successor_the_smaller_world(tmp_path):
    """A hand-over in the middle of an elastic episode: slice 1 dropped (host 3 lost), then host 0's
    supervisor, the leader, crashes. Its successor carries on the world as it was (slice 0 active,
    host 2 parked), restarts slice 0 alone, and scales back up when capacity returns."""
    policy = tmp_path / "policy.py"
    policy.write_text(ELASTIC_AND_REMEMBERING)
    result, report = run_job(
        tmp_path,
        "--policy",
        str(policy),
        "--chaos",
        "lose:host=3@step=30,crash-supervisor:host=0@step=45,spare:+1@step=70",
        steps=ELASTIC_STEPS,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert report is not None
    [change] = report["leader_changes"]
    assert change["from_host"] == 0, change
    decisions = [d for d in report["decisions"] if d["event"]["kind"] != "straggler"]
    assert [(d["event"]["kind"], d["action"]["name"]) for d in decisions] == [
        ("host_lost", "scale_down"),
        ("crash", "restart"),
        ("capacity_returned", "scale_up"),
    ], decisions
    assert [w["hosts"] for w in report["world"]] == [4, 2, 4]
    # The hand-over itself is no capacity returning: host 2, idle before it, rejoined idle.
    assert report["restarts"] == {"host_lost": 1, "crash": 1, "capacity_returned": 1}
    assert report["params_fingerprint"] == sdk_loop_fingerprint(ELASTIC_STEPS)
    assert report["steps_completed"] == ELASTIC_STEPS
    assert processes_mentioning(report["run_dir"]) == []


def killing_the_leader_at(tmp_path: Path, said: str, *args: str, **spec: Any) -> tuple[dict[str, Any], str]:
    """`slicekeeper run` of the SDK loop job with `args`; once the runtime says `said`, host 0's
    supervisor (the leader) is killed (the runtime starts it again). The run must succeed: its report
    and run directory."""
    job = sdk_loop_job(tmp_path / "job.yaml", **spec)
    report_path = tmp_path / "report.json"
    with started_cli("run", str(job), "--report", str(report_path), *args) as process:
        assert process.stdout is not None
        run_dir = None
        for line in process.stdout:
            if "run directory:" in line:
                run_dir = line.split("run directory:")[1].split()[0]
            if said in line:
                break
        assert run_dir is not None
        os.kill(supervisor_of(run_dir, 0), signal.SIGKILL)
        _, err = process.communicate(timeout=180)
    assert process.returncode == 0, err[-3000:]
    return read_report(report_path), run_dir


def test_the_leader_lost_in_the_middle_of_a_hot_swap_lets_its_successor_finish_it(
    tmp_path, clean_fingerprint
):
    """Host 2 is lost and a spare is assigned its identity; while the spare stages host 2's shard
    from a peer, host 0's supervisor (the leader) is killed. Its successor carries on the journal,
    which holds the assignment: the spare joins as host 2, the swap is counted once, and the job ends
    with the fault-free parameters."""
    chaos = "lose:host=2@step=15"
    report, run_dir = killing_the_leader_at(tmp_path, "hot-swap: spare 0", "--spares", "1", "--chaos", chaos)
    assert problems(report, fingerprint=clean_fingerprint, steps=STEPS) == []
    # Counted once: journaled before the spare was told, carried on by the successor.
    assert report["hot_swaps"]["hosts"] == [2] and report["hot_swaps"]["count"] == 1
    assert report["hosts"][2]["machines"] == ["host-2", "spare-0"]
    # Host 0's crash, while the job was stopping for host 2, costs that restart or one of its own.
    assert report["restarts"]["host_lost"] == 1 and set(report["restarts"]) <= {"host_lost", "crash"}
    [change] = report["leader_changes"]
    assert change["from_host"] == 0, change
    assert processes_mentioning(run_dir) == []


def test_the_leader_lost_in_the_middle_of_a_scale_up_lets_its_successor_finish_it(tmp_path):
    """Slice 1 dropped (host 3 lost), capacity returns and the policy scales back up: a spare is
    assigned host 3; then the leader's supervisor is killed. The successor finishes the scale-up."""
    policy = tmp_path / "policy.py"
    policy.write_text(ELASTIC_AND_REMEMBERING)
    chaos = "lose:host=3@step=30,spare:+1@step=60"
    report, run_dir = killing_the_leader_at(
        tmp_path, "scale-up: spare", "--policy", str(policy), "--chaos", chaos, steps=ELASTIC_STEPS
    )
    assert [(e["kind"], e["from_hosts"], e["to_hosts"]) for e in report["scale_events"]] == [
        ("down", 4, 2),
        ("up", 2, 4),
    ]
    assert [w["hosts"] for w in report["world"]] == [4, 2, 4]
    assert report["hot_swaps"]["count"] == 0  # the spare came in through the scale-up
    assert report["hosts"][3]["machines"][-1] == "spare-0"
    [change] = report["leader_changes"]
    assert change["from_host"] == 0, change
    assert report["params_fingerprint"] == sdk_loop_fingerprint(ELASTIC_STEPS)
    assert report["steps_completed"] == ELASTIC_STEPS
    assert processes_mentioning(run_dir) == []
