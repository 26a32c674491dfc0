"""`slicekeeper simulate --report PATH`: the simulated run as a run's report, which the text report,
the page and `slicekeeper policy replay` all read like a real run's."""

from __future__ import annotations

import json

from slicekeeper.supervisor.fleet import report_file
from slicekeeper.supervisor.fleet.costs import CostModel
from slicekeeper.supervisor.fleet.failures import Category, Effect, Failure
from slicekeeper.supervisor.fleet.outcome import Job
from slicekeeper.supervisor.fleet.simulation import Simulation
from slicekeeper.supervisor.leader.restart_rule import RestartRule

from slicekeeper.policy.engine import PolicyEngine
from slicekeeper.policy.replay import read_log
from slicekeeper.report import build_report, format_report
from slicekeeper.report_timeline import time_ticks
from slicekeeper.shape import JobShape
from tests.support.cli_runs import ROOT, run_cli

DAY = 86_400.0


def simulated():
    job = Job(JobShape(4, 2, 4), 1, 10, 100, 1, RestartRule(100))
    failures = [
        Failure(3_000.0, 3, Category("faulty chip", 0.0, Effect.HOST_LOST)),
        Failure(9_000.0, 5, Category("software bug", 0.0, Effect.CRASH)),
        Failure(
            20_000.0, 6, Category("faulty chip", 0.0, Effect.HOST_LOST)
        ),  # no spare back yet: new machine
    ]
    costs = CostModel(replacement_seconds=30_000.0)
    return Simulation(job, costs, PolicyEngine(), priced=False, keep_records=True).run(
        failures, DAY
    )  # waits for a machine


def test_the_report_has_every_key_of_a_real_runs_report_and_its_faults_and_decisions(tmp_path):
    result = simulated()
    report = report_file.simulated_report(result, job="sim", step_seconds=10.0, simulated={"chips": 32})
    real = build_report(job_name="x", started_at=0.0, wall_seconds=1.0, summary={}, hosts=[])
    assert set(real) <= set(report)
    assert [(f["kind"], f["host"], f["detected_as"]) for f in report["faults"]] == [
        ("host_lost", 3, "host_lost"),
        ("crash", 5, "crash"),
        ("host_lost", 6, "host_lost"),
    ]
    assert [d["action"]["name"] for d in report["decisions"]] == ["replace", "restart", "replace"]
    assert report["hot_swaps"]["hosts"] == [3, 6]
    assert [w["slices"] for w in report["world"]] == [[0, 1, 2, 3]]  # no scale-down: one world
    assert len(report_file.write(report, result, tmp_path / "r.json")[1].read_text().splitlines()) == 3
    assert report["restarts"] == {"crash": 1, "host_lost": 2}
    assert report["goodput"] == round(result.goodput, 4)
    text = format_report(report)
    assert "fault host_lost host 3" in text and "host 6 -> new-machine-1" in text


def test_the_cli_writes_the_report_its_event_log_and_its_page(tmp_path):
    path = tmp_path / "sim.json"
    result = run_cli(
        "simulate",
        str(ROOT / "examples" / "trainingjob.yaml"),
        "--chips",
        "4096",
        "--days",
        "10",
        "--report",
        str(path),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    report = json.loads(path.read_text())
    assert report["goodput"] == figures["goodput"]
    assert report["simulated"]["baselines"] == figures["baselines"]
    assert figures["report"]["page"] == str(path.with_suffix(".html"))
    assert "<svg" in path.with_suffix(".html").read_text()
    records = read_log(report["events_log"])
    assert len(records) == len(report["decisions"]) > 0
    replayed = run_cli("policy", "replay", report["events_log"])
    assert replayed.returncode == 0, replayed.stderr
    assert f"0 of {len(records)} decision(s) differ" in replayed.stdout


def test_a_report_in_a_missing_directory_is_refused_before_anything_runs(tmp_path):
    result = run_cli(
        "simulate", str(ROOT / "examples" / "trainingjob.yaml"), "--report", str(tmp_path / "no" / "r.json")
    )
    assert result.returncode != 0
    assert "--report" in result.stderr and "is not a directory" in result.stderr


def test_a_long_timeline_is_labelled_in_days_and_hours():
    assert time_ticks(54 * DAY)[:3] == [(0.0, "0 d"), (10 * DAY, "10 d"), (20 * DAY, "20 d")]
    assert time_ticks(12 * 3600.0)[1] == (2 * 3600.0, "2 h")
    assert time_ticks(600.0)[1] == (100.0, "1:40")
    assert time_ticks(60.0)[1] == (10.0, "10 s")
