"""Remediation policies end to end: `slicekeeper run` of the SDK example loop with chaos.

A user policy that forbids hot-swap scales down and back up; a slowed host is reported as a straggler
(and replaced when a spare waits); the recorded event log replays under another policy. The loop's
hosts compute the same parameters whatever the world size, so every run ends with the fault-free
parameters (`sdk_loop_fingerprint`).
"""

from tests.support.cli_runs import ROOT, run_cli, run_job, sdk_loop_fingerprint

STEPS = 120
NO_HOT_SWAP = str(ROOT / "examples" / "policies" / "no_hot_swap.py")


def test_a_healthy_run_reports_no_straggler_and_decides_nothing(tmp_path):
    result, report = run_job(tmp_path, steps=STEPS)
    assert result.returncode == 0, result.stderr
    assert report["params_fingerprint"] == sdk_loop_fingerprint(STEPS)
    assert report["stragglers"] == []
    assert report["decisions"] == []
    assert [w["hosts"] for w in report["world"]] == [4]


def test_a_policy_forbidding_hot_swap_scales_down_then_back_up_with_the_user_decisions_reported(elastic):
    _, report = elastic
    decisions = [d for d in report["decisions"] if d["event"]["kind"] != "straggler"]  # noise: reported
    assert [(d["event"]["kind"], d["action"]["name"], d["source"]) for d in decisions] == [
        ("host_lost", "scale_down", "user"),
        ("capacity_returned", "scale_up", "user"),
    ]
    assert [(e["kind"], e["from_hosts"], e["to_hosts"]) for e in report["scale_events"]] == [
        ("down", 4, 2),
        ("up", 2, 4),
    ]
    assert [w["hosts"] for w in report["world"]] == [4, 2, 4]
    assert report["hot_swaps"]["count"] == 0  # the spare came in through the scale-up, not a swap
    assert report["badput_seconds"]["scaled_down"] > 0  # host 2 idled while its slice was dropped
    assert report["params_fingerprint"] == sdk_loop_fingerprint(STEPS)
    assert report["steps_completed"] == STEPS


def test_the_event_log_is_written_next_to_the_report_and_replays_under_another_policy(elastic):
    where, report = elastic
    log = where / "report.events.jsonl"
    assert report["events_log"] == str(log)
    replayed = run_cli("policy", "replay", str(log))  # the default policy: it would have hot-swapped
    assert replayed.returncode == 0, replayed.stderr
    [lost] = [line for line in replayed.stdout.splitlines() if "host_lost" in line]
    assert "ScaleDown" in lost and "ReplaceHost(host=3)" in lost and lost.endswith("*")
    same = run_cli("policy", "replay", str(log), "--policy", NO_HOT_SWAP)
    assert same.returncode == 0, same.stderr
    assert f"0 of {len(report['decisions'])} decision(s) differ" in same.stdout


def test_a_slowed_host_is_reported_as_a_straggler_with_its_score(tmp_path):
    result, report = run_job(tmp_path, "--chaos", "slow:host=2,factor=2@step=30", steps=STEPS)
    assert result.returncode == 0, result.stderr
    [straggler] = report["stragglers"]
    assert straggler["host"] == 2
    assert straggler["score"] > 1.5
    assert 30 < straggler["step"] <= 30 + 15
    [decision] = report["decisions"]
    assert (decision["action"]["name"], decision["source"]) == ("ignore", "default")  # no spare
    [slow] = report["faults"]
    assert slow["detected_as"] == "straggler"
    assert report["params_fingerprint"] == sdk_loop_fingerprint(STEPS)


def test_a_straggler_is_replaced_by_a_waiting_spare_and_its_machine_retired(tmp_path):
    result, report = run_job(
        tmp_path, "--spares", "1", "--chaos", "slow:host=1,factor=3@step=20", steps=STEPS
    )
    assert result.returncode == 0, result.stderr
    assert [s["host"] for s in report["stragglers"]] == [1]
    assert report["decisions"][0]["action"] == {"name": "replace", "host": 1}
    assert report["hot_swaps"]["hosts"] == [1]
    host_1 = next(h for h in report["hosts"] if h["host"] == 1)
    assert host_1["machines"] == ["host-1", "spare-0"]
    assert report["params_fingerprint"] == sdk_loop_fingerprint(STEPS)
