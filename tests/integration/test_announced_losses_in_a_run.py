"""Announced losses end to end: a machine's maintenance announced ahead costs no step trained again,
and less badput than the same machine lost without a word at the same step; a preemption whose grace
is too short for the save is the unannounced path, and the report says so.

The SDK example loop (50 ms steps) with a checkpoint every 10 steps: lost unannounced at step 39, the
job restores step 30 and trains 9 steps again.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.support.cli_runs import processes_mentioning, run_job, sdk_loop_fingerprint
from tests.support.recovery_checks import problems

STEPS = 80
AT = 39
CHECKPOINT = {"interval": 10}


def loss_run(tmp_path, chaos: str) -> dict[str, Any]:
    result, report = run_job(tmp_path, "--spares", "1", "--chaos", chaos, steps=STEPS, checkpoint=CHECKPOINT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert report is not None
    assert problems(report, fingerprint=sdk_loop_fingerprint(STEPS), steps=STEPS) == []
    assert report["hot_swaps"]["hosts"] == [1]
    assert processes_mentioning(report["run_dir"]) == []
    report["stdout"] = result.stdout
    return report


def recovery_badput(report: dict[str, Any]) -> float:
    return report["badput_seconds"].get("wasted_progress", 0.0) + report["badput_seconds"].get(
        "infrastructure_recovery", 0.0
    )


@pytest.mark.alone  # the two runs' badput compared: both must see the same load
def test_an_announced_maintenance_costs_no_step_and_less_badput_than_the_same_loss_unannounced(tmp_path):
    announced = loss_run(tmp_path / "announced", f"maintenance:host=1,notice=10@step={AT}")
    [recovery] = announced["recoveries"]
    assert recovery["cause"] == "announced_loss" and recovery["restore_step"] > AT
    assert recovery["steps_replayed"] == 0
    [loss] = announced["announced_losses"]
    assert (loss["cause"], loss["host"], loss["saved_step"], loss["action"]) == (
        "maintenance",
        1,
        recovery["restore_step"],
        "replace",
    )
    assert announced["restarts"] == {"announced_loss": 1}
    [fault] = announced["faults"]
    assert (fault["kind"], fault["detected_as"]) == ("maintenance", "announced_loss")
    assert f"step {loss['saved_step']} saved on every host first" in announced["stdout"]

    # The negative control: the same machine lost without a word at the same step.
    lost = loss_run(tmp_path / "lost", f"lose:host=1@step={AT}")
    [unannounced] = lost["recoveries"]
    assert unannounced["restore_step"] == 30 and unannounced["steps_replayed"] > 0
    assert announced["badput_seconds"].get("wasted_progress", 0.0) == 0.0
    assert lost["badput_seconds"]["wasted_progress"] > 0.0
    assert recovery_badput(announced) < recovery_badput(lost)


def test_a_preemption_whose_grace_is_too_short_for_the_save_is_the_unannounced_path(tmp_path):
    report = loss_run(tmp_path, f"preempt:host=1,grace=0.3@step={AT}")
    [loss] = report["announced_losses"]
    assert (loss["cause"], loss["saved_step"]) == ("preemption", None)
    [asked] = re.findall(r"saving step (\d+) on every host", report["stdout"])
    [recovery] = report["recoveries"]
    # The newest checkpoint of the interval the hosts reached meanwhile, not the step asked for.
    assert recovery["restore_step"] % CHECKPOINT["interval"] == 0 and recovery["restore_step"] < int(asked)
    assert "no step saved in time: the unannounced path" in report["stdout"]
