"""`slicekeeper simulate --sweep`: every combination of settings on one failure schedule, the best one,
and the textbook optimum interval beside it (the sweep's best lands near it; with no failures the
longest interval wins: the negative control of a sweep that only echoed its input)."""

from __future__ import annotations

import json
import math

import pytest
from slicekeeper.supervisor.fleet.costs import CostModel
from slicekeeper.supervisor.fleet.failures import LLAMA3, FailureModel
from slicekeeper.supervisor.fleet.projection import scenario
from slicekeeper.supervisor.fleet.sweep import optimum_steps, parse, sweep

from slicekeeper.api import load_training_job
from slicekeeper.errors import UserError
from tests.support.cli_runs import ROOT, run_cli

JOB = ROOT / "examples" / "trainingjob.yaml"


def test_settings_are_parsed_name_by_name():
    assert parse(["checkpoint.interval=5,10,spares=0,64", "cost.replacement_seconds=60"]) == {
        "checkpoint.interval": [5, 10],
        "spares": [0, 64],
        "cost.replacement_seconds": [60],
    }


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("budget=3", "'budget' is not one of"),
        ("cost.warp_factor=9", "'cost.warp_factor' is not one of"),
        ("step_seconds=5", "'step_seconds' is not one of"),  # a cost field needs its cost. prefix
        ("cost.=5", "'cost.' is not one of"),
        ("spares=two", "'two' is not a number (for spares)"),
        ("checkpoint.interval=0", "checkpoint.interval cannot be 0"),
        ("5,10", "expected NAME=VALUE"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(spec, says):
    with pytest.raises(UserError) as error:
        parse([spec])
    assert str(error.value).startswith(f"--sweep {spec!r}: ") and says in str(error.value)


def test_a_setting_given_twice_is_refused():
    with pytest.raises(UserError, match="'spares' is given twice"):
        parse(["spares=0", "spares=64"])


def test_young_and_daly_agree_when_a_save_is_short_and_daly_caps_at_the_mtbf():
    costs = CostModel(step_seconds=10.0, shard_gb=4.0, snapshot_gb_per_second=10.0)  # a 0.4 s save
    rate = 1 / 10_000.0
    optimum = optimum_steps(costs, rate)
    assert optimum["young"] == pytest.approx(math.sqrt(2 * 0.4 * 10_000) / 10)
    assert optimum["daly"] == pytest.approx(optimum["young"], rel=0.01)
    slow = CostModel(step_seconds=10.0, shard_gb=4.0, snapshot_gb_per_second=0.0001)  # a 40,000 s save
    assert optimum_steps(slow, rate)["daly"] == pytest.approx(10_000 / 10)


def chosen(failures: FailureModel, days: float = 54):
    return scenario(
        load_training_job(JOB),
        chips=16_384,
        slices=None,
        days=days,
        failures=failures,
        costs=CostModel(),
        spares=None,
        seed=0,
        max_restarts=None,
    )


def test_the_best_interval_lies_near_the_optimum_and_without_failures_the_longest_wins():
    intervals = [1.0, 3.0, 9.0, 27.0, 81.0]
    figures = sweep(chosen(LLAMA3), {"checkpoint.interval": intervals}, progress=False)
    assert [r["setting"]["checkpoint.interval"] for r in figures["rows"]] == [1, 3, 9, 27, 81]
    assert figures["best"] == max(figures["rows"], key=lambda r: r["goodput"])
    assert figures["best"]["setting"]["checkpoint.interval"] == 9  # Young: 8.9 steps
    assert figures["optimum_interval_steps"]["young"] == pytest.approx(8.9, abs=0.1)
    quiet = sweep(
        chosen(FailureModel("none", "no failures", ()), days=5),
        {"checkpoint.interval": intervals},
        progress=False,
    )
    assert quiet["best"]["setting"]["checkpoint.interval"] == 81
    assert quiet["optimum_interval_steps"]["young"] == math.inf


def test_the_cli_prints_the_table_or_one_json_object(tmp_path):
    table = run_cli("simulate", str(JOB), "--chips", "4096", "--days", "5", "--sweep", "spares=0,16")
    assert table.returncode == 0, table.stderr
    assert "<- best" in table.stdout and "optimum checkpoint interval" in table.stdout
    assert "[2/2]" in table.stderr  # progress, on stderr
    as_json = run_cli(
        "simulate", str(JOB), "--chips", "4096", "--days", "5", "--sweep", "spares=0,16", "--json"
    )
    figures = json.loads(as_json.stdout)
    assert [r["setting"] for r in figures["rows"]] == [{"spares": 0}, {"spares": 16}]
    refused = run_cli("simulate", str(JOB), "--sweep", "spares=0", "--report", str(tmp_path / "r.json"))
    assert refused.returncode != 0 and "--report goes with a single simulation" in refused.stderr
