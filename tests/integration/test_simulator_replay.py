"""The fleet simulator validated against real runs: `slicekeeper simulate JOB --replay REPORT` predicts
each local run's goodput within 0.03 of the measured one, from the run's faults and measured costs,
and from another run's costs too (a prediction that uses nothing the run measured of its recoveries).

Three fault mixes of the SDK example loop: the elastic episode (a lost host, a user policy that scales
down, a spare joining and a scale-up), a ladder (a crash, a host lost to the spare, an announced loss
with no spare left, so a scale-down, and a crash in the smaller world), and a lost host with no spare
(a scale-down) and a crash. The negative control replays against the job with a tenfold checkpoint
interval: the steps trained again are then mispredicted and the check fails.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli_runs import ROOT, run_cli, run_job

pytestmark = pytest.mark.alone  # one run's costs predict another's: both must see the same load

TOLERANCE = 0.03
NO_HOT_SWAP = str(ROOT / "examples" / "policies" / "no_hot_swap.py")


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory, elastic: tuple[Path, dict[str, Any]]
) -> dict[str, list[str]]:
    """Run name -> the `simulate` arguments that replay it (job file, report, spares, policy)."""
    made = {"elastic": [str(elastic[0] / "job.yaml"), "--replay", str(elastic[0] / "report.json")]}
    made["elastic"] += ["--spares", "1", "--policy", NO_HOT_SWAP]
    mixes = {
        "ladder": (
            ["--spares", "1"],
            "kill:host=0@step=30,lose:host=3@step=70,maintenance:host=1,notice=1@step=110,kill:host=2@step=150",
        ),
        "no spare": ([], "lose:host=2@step=50,kill:host=0@step=120"),
    }
    for name, (spares, chaos) in mixes.items():
        where = tmp_path_factory.mktemp(name.replace(" ", "-"))
        result, report = run_job(where, *spares, "--chaos", chaos, steps=200)
        assert result.returncode == 0, result.stderr
        assert report is not None and report["steps_completed"] == 200
        made[name] = [str(where / "job.yaml"), "--replay", str(where / "report.json"), *spares]
    return made


def replayed(arguments: list[str]) -> dict[str, Any]:
    result = run_cli("simulate", *arguments, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", ["elastic", "ladder", "no spare"])
def test_each_run_is_predicted_within_0_03_with_the_same_decisions(runs, name):
    figures = replayed(runs[name])
    assert figures["not_simulated"] == []
    assert abs(figures["error"]) <= TOLERANCE, figures
    assert figures["predicted"]["decisions"] == figures["measured"]["decisions"]
    assert figures["predicted"]["steps"] == figures["steps"]


def test_the_costs_of_another_run_predict_each_run_within_0_03(runs):
    """The ladder's recovery costs predict the other two runs, and the elastic run's the ladder."""
    sources = {"elastic": "ladder", "no spare": "ladder", "ladder": "elastic"}
    for name, source in sources.items():
        figures = replayed([*runs[name], "--costs-from", runs[source][2]])
        assert figures["costs_from"] == runs[source][2]
        assert abs(figures["error"]) <= TOLERANCE, (name, figures)


def test_a_wrong_checkpoint_interval_misses_by_more_than_the_tolerance(runs, tmp_path):
    """The negative control: the same run replayed as if it saved every 50 steps, not every 5."""
    job = yaml.safe_load(Path(runs["ladder"][0]).read_text())
    job["spec"]["checkpoint"]["interval"] = 50
    wrong = tmp_path / "job.yaml"
    wrong.write_text(yaml.safe_dump(job))
    figures = replayed([str(wrong), *runs["ladder"][1:]])
    assert figures["error"] < -TOLERANCE, figures


def test_the_comparison_table_names_both_figures(runs):
    result = run_cli("simulate", *runs["no spare"])
    assert result.returncode == 0, result.stderr
    assert "measured   predicted" in result.stdout
    assert "predicted - measured goodput:" in result.stdout
