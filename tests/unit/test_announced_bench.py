"""benchmarks/announced.py's own logic: its scenarios are valid chaos on one host at one step, a run's
report becomes its figures (a run that did not recover fails), and the table shows the medians."""

from __future__ import annotations

import pytest

from benchmarks import announced
from benchmarks.harness import RunFailed
from slicekeeper.chaos import parse_chaos


def test_every_scenario_loses_host_1_at_the_same_step():
    faults = [parse_chaos(chaos) for chaos in announced.scenarios(34, 30.0, 10.0).values()]
    assert [(f.host, f.step) for [f] in faults] == [(1, 34)] * 4
    assert [f.kind.value for [f] in faults] == ["lose", "maintenance", "preempt", "partition"]


def report(**fault: object) -> dict:
    return {
        "state": "succeeded",
        "run_dir": "/tmp/run",
        "params_fingerprint": "abc",
        "faults": [{"kind": "lose", "detection_seconds": 0.1, "recovery_seconds": 1.5, **fault}],
        "recoveries": [{"cause": "host_lost", "steps_replayed": 4}],
        "badput_seconds": {"wasted_progress": 0.3, "infrastructure_recovery": 0.1, "other": 2.0},
        "goodput": 0.6,
    }


def test_a_report_becomes_the_figures_of_its_loss():
    figures = announced.analyse(1, report())
    assert (figures.steps_again, figures.wasted_progress, figures.badput) == (4, 0.3, pytest.approx(2.4))
    assert (figures.detection_seconds, figures.recovery_seconds) == (0.1, 1.5)


def test_negative_control_a_loss_never_recovered_from_fails_the_run():
    with pytest.raises(RunFailed, match="was not detected and recovered"):
        announced.analyse(1, report(recovery_seconds=None))


def test_the_table_shows_each_scenarios_medians():
    runs = [announced.analyse(n, report(detection_seconds=d)) for n, d in ((1, 0.1), (2, 0.5), (3, 0.2))]
    text = announced.table({"unannounced loss": runs, "maintenance": []})
    lines = text.splitlines()
    assert lines[0].startswith("| scenario") and "steps again" in lines[0]
    assert "| unannounced loss | 3    | 4" in lines[2] and "0.20" in lines[2]  # the median detection
    assert lines[3].startswith("| maintenance      | 0    | -")
