"""A recorded run through the simulator (supervisor/fleet/replay.py): faults at the steps they came at,
the run ending at its last step, a spare joining brings a dropped slice back, and a report that cannot
be replayed is refused with the file and what it lacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slicekeeper.supervisor.fleet.costs import CostModel, SizeCurve
from slicekeeper.supervisor.fleet.failures import Category, Effect, Failure
from slicekeeper.supervisor.fleet.outcome import Job
from slicekeeper.supervisor.fleet.replay import failures_of, read_report, replay
from slicekeeper.supervisor.fleet.simulation import Simulation
from slicekeeper.supervisor.leader.restart_rule import RestartRule

from slicekeeper.api import load_training_job
from slicekeeper.errors import UserError
from slicekeeper.goodput import Category as Badput
from slicekeeper.policy.engine import PolicyEngine
from slicekeeper.shape import JobShape
from tests.support.cli_runs import ROOT

STEP = 0.1
COSTS = CostModel(
    step_seconds=STEP,
    shard_gb=1.0,
    crash_detect_seconds=0.5,
    lost_detect_seconds=2.0,
    restart_round=SizeCurve(0.3, 0.0),
    distributed_init_seconds=0.0,
    program_load_seconds=0.2,
    program_compile_seconds=0.2,
    local_gb_per_second=1e6,
    peer_gb_per_second=1e6,
    snapshot_gb_per_second=1e6,
    replacement_seconds=1e12,
)


def local_job(spares: int = 0, min_slices: int = 1) -> Job:
    return Job(JobShape(2, 2, 1), min_slices, 10, 10, spares, RestartRule(10), new_machines=False)


def at_step(step: int, effect: Effect, host: int = 1) -> Failure:
    return Failure(0.0, host, Category("replayed", 0.0, effect), step=step)


def test_a_crash_at_a_step_costs_the_steps_since_the_save_and_the_run_ends_at_its_last_step():
    result = Simulation(local_job(), COSTS, PolicyEngine()).run(
        [at_step(24, Effect.CRASH)], 1e6, start={Badput.OTHER: 1.0}, until_step=100, end_seconds=0.5
    )
    assert result.steps == 100
    assert result.badput_seconds(3)[Badput.WASTED_PROGRESS] == pytest.approx(3 * STEP)  # 23 -> 20
    recovery = 0.5 + 0.3 + 0.2  # detection, the round, program load
    assert result.seconds == pytest.approx(1.0 + 103 * STEP + recovery + 0.5, abs=1e-3)
    assert result.goodput == pytest.approx(100 * STEP / result.seconds)


def test_a_fault_after_the_last_step_never_comes():
    result = Simulation(local_job(), COSTS, PolicyEngine()).run(
        [at_step(150, Effect.CRASH)], 1e6, start={}, until_step=100
    )
    assert result.failures == 0 and result.seconds == pytest.approx(100 * STEP)


def test_a_local_run_without_a_spare_scales_down_and_a_joining_spare_brings_the_slice_back():
    """Locally no new machine comes by itself (the fleet's `new_machines`): the default policy scales
    down, and the spare that joins at step 60 is offered as capacity that came back."""
    result = Simulation(local_job(), COSTS, PolicyEngine()).run(
        [at_step(30, Effect.HOST_LOST, host=3), at_step(60, Effect.CAPACITY, host=-1)],
        1e6,
        start={},
        until_step=100,
    )
    assert result.decisions == {"scale_down": 1, "scale_up": 1}
    assert result.badput_seconds(3)[Badput.SCALED_DOWN] > 0
    alone = Simulation(local_job(), COSTS, PolicyEngine()).run(
        [at_step(30, Effect.HOST_LOST, host=3)], 1e6, start={}, until_step=100
    )
    assert alone.decisions == {"scale_down": 1}  # the negative control: nothing came back


def report_with(tmp_path: Path, faults: list[dict[str, object]], **changes: object) -> Path:
    report = {
        "wall_seconds": 12.0,
        "steps_completed": 100,
        "productive_seconds": 10.0,
        "goodput": 0.83,
        "badput_seconds": {},
        "faults": faults,
        "hosts": [{"host": h, "slice": h // 2, "productive_seconds": 10.0} for h in range(4)],
        "events_log": str(tmp_path / "report.events.jsonl"),
        **changes,
    }
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    return path


def test_a_report_whose_run_directory_is_gone_is_refused_naming_it(tmp_path):
    path = report_with(tmp_path, [], run_dir=str(tmp_path / "gone"))
    job = load_training_job(ROOT / "examples" / "trainingjob.yaml")
    with pytest.raises(UserError, match=r"run directory \(.*gone\) is missing"):
        replay(job, path)
    (tmp_path / "gone").mkdir()  # there, but no host's event log in it
    with pytest.raises(UserError, match=r"hold no step of any host"):
        replay(job, path)


def test_a_file_that_is_not_a_report_is_refused_naming_what_it_lacks(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"goodput": 0.5}))
    with pytest.raises(UserError, match=r"other\.json: no 'wall_seconds'"):
        read_report(path)
    path.write_text("{not json")
    with pytest.raises(UserError, match="not a readable report"):
        read_report(path)


def test_faults_the_simulator_does_not_model_are_named_and_left_out(tmp_path):
    faults = [
        {"kind": "kill", "host": 1, "step": 30, "detected_as": "crash", "fired_at": 3.0},
        {"kind": "slow", "host": 2, "step": 40, "detected_as": "straggler", "fired_at": 4.0},
        {"kind": "spare", "host": -1, "step": 50, "detected_as": None, "fired_at": 5.0},
    ]
    found, skipped = failures_of(json.loads(report_with(tmp_path, faults).read_text()))
    assert [(f.step, f.category.effect) for f in found] == [(30, Effect.CRASH), (50, Effect.CAPACITY)]
    assert skipped == ["slow on host 2 at step 40 (detected as straggler)"]


def test_a_smaller_world_trains_at_its_own_measured_step_time():
    """On one machine fewer hosts share its cores: a replay gives each world its step time."""
    lost = [at_step(30, Effect.HOST_LOST, host=3)]
    same = Simulation(local_job(), COSTS, PolicyEngine()).run(lost, 1e6, start={}, until_step=100)
    faster = Simulation(local_job(), COSTS, PolicyEngine(), step_seconds_by_slices={1: STEP / 2}).run(
        lost, 1e6, start={}, until_step=100
    )
    assert same.seconds - faster.seconds == pytest.approx(80 * STEP / 2, abs=1e-3)  # restored 20 -> 100
