"""The fleet simulator (supervisor/fleet): failure schedules at the model's rates, the accounting of a
run with no failure and with one, and the real state machine and policy engine in the loop (a user
policy and the restart rule each change the outcome, which a simulator of its own rules would not)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pytest
from slicekeeper.supervisor.fleet import failures as fleet_failures
from slicekeeper.supervisor.fleet.costs import CostModel, with_settings
from slicekeeper.supervisor.fleet.failures import Category, Effect, Failure, failure_model, schedule
from slicekeeper.supervisor.fleet.outcome import Job, Mode
from slicekeeper.supervisor.fleet.simulation import Simulation
from slicekeeper.supervisor.leader.restart_rule import RestartRule

from slicekeeper.errors import UserError
from slicekeeper.goodput import Category as Badput
from slicekeeper.policy.engine import PolicyEngine, load_policy
from slicekeeper.shape import JobShape
from tests.support.cli_runs import ROOT

COSTS = CostModel(step_seconds=10.0, shard_gb=4.0)
DAY = 86_400.0


def job(slices: int = 4, spares: int = 2, max_restarts: int = 10**9) -> Job:
    return Job(JobShape(slices, 2, 4), 1, 10, 100, spares, RestartRule(max_restarts))


def crash_at(t: float, host: int = 1) -> Failure:
    return Failure(t, host, Category("software bug", 0.0, Effect.CRASH))


def test_the_llama3_model_has_the_papers_rate():
    assert fleet_failures.LLAMA3.per_chip_day * 16_384 * 54 == pytest.approx(419 + 47)
    unexpected = sum(c.per_chip_day for c in fleet_failures.KOKOLIS.categories) * 16_384
    assert 24 / unexpected == pytest.approx(fleet_failures.KOKOLIS_MTTF_HOURS)


def test_a_schedule_draws_the_models_rate_on_hosts_of_the_job_in_time_order():
    found = schedule(fleet_failures.LLAMA3, chips=16_384, host_count=4_096, seconds=54 * DAY, seed=3)
    assert abs(len(found) - 466) < 4 * math.sqrt(466)
    assert [f.t for f in found] == sorted(f.t for f in found)
    assert all(0 <= f.host < 4_096 for f in found)
    assert found == schedule(fleet_failures.LLAMA3, chips=16_384, host_count=4_096, seconds=54 * DAY, seed=3)


def test_with_no_failure_the_only_badput_is_the_saves():
    result = Simulation(job(), COSTS, PolicyEngine()).run([], DAY, start={})
    cycle = 10 * COSTS.step_seconds
    assert result.goodput == pytest.approx(cycle / (cycle + COSTS.snapshot()), rel=1e-5)
    assert set(result.badput_seconds()) == {Badput.CHECKPOINT_SAVE}


def test_the_first_start_is_booked_by_the_cost_model_unless_given():
    result = Simulation(job(), COSTS, PolicyEngine()).run([], DAY)
    booked = result.badput_seconds()
    assert booked[Badput.TPU_INITIALIZATION] == pytest.approx(COSTS.distributed_init_seconds, abs=0.1)
    assert booked[Badput.PROGRAM_STARTUP] == pytest.approx(COSTS.program_compile_seconds, abs=0.1)
    measured = Simulation(job(), COSTS, PolicyEngine()).run([], DAY, start={Badput.OTHER: 3.0})
    assert measured.badput_seconds()[Badput.OTHER] == pytest.approx(3.0, abs=0.1)
    assert Badput.PROGRAM_STARTUP not in measured.badput_seconds()


def test_a_crash_costs_the_steps_since_the_last_save_and_a_restart_from_the_local_tier():
    at = 500 * (10 * COSTS.step_seconds + COSTS.snapshot()) + 55.0  # 5.5 steps after a save
    result = Simulation(job(), COSTS, PolicyEngine()).run([crash_at(at)], DAY, start={})
    badput = result.badput_seconds()
    assert badput[Badput.WASTED_PROGRESS] == pytest.approx(55.0, abs=0.1)
    restart = COSTS.restart_round.at(8) + COSTS.crash_detect_seconds
    assert badput[Badput.INFRASTRUCTURE_RECOVERY] == pytest.approx(restart, abs=0.1)
    assert badput[Badput.CHECKPOINT_RESTORE] == pytest.approx(
        COSTS.restore(COSTS.local_gb_per_second), abs=0.1
    )
    assert badput[Badput.PROGRAM_STARTUP] == pytest.approx(COSTS.program_load_seconds, abs=0.1)
    assert result.decisions == {"restart": 1}


def test_a_lost_host_is_handed_to_a_spare_and_restored_from_a_peer():
    lost = Failure(5_000.0, 3, Category("faulty chip", 0.0, Effect.HOST_LOST))
    result = Simulation(job(spares=1), COSTS, PolicyEngine()).run([lost], DAY)
    assert result.decisions == {"replace": 1}
    assert result.badput_seconds()[Badput.CHECKPOINT_RESTORE] == pytest.approx(
        COSTS.restore(COSTS.peer_gb_per_second), abs=0.1
    )


def test_a_whole_slice_lost_asks_the_policy_once_per_host():
    event = Failure(5_000.0, 3, Category("host maintenance", 0.0, Effect.HOST_LOST, whole_slice=True))
    result = Simulation(job(spares=2), COSTS, PolicyEngine()).run([event], DAY)
    assert result.decisions == {"replace": 2}


def test_the_users_policy_decides(tmp_path):
    """A policy file that fails the job on any crash: the simulated job fails with its reason. The
    negative control is the default ladder's restart above."""
    path = tmp_path / "strict.py"
    path.write_text(
        textwrap.dedent(
            """
            from slicekeeper.policy import Fail

            def on_crash(event, context):
                return Fail(reason="no crash is tolerated here")
            """
        )
    )
    result = Simulation(job(), COSTS, PolicyEngine(load_policy(path))).run([crash_at(5_000.0)], DAY)
    assert result.decisions == {"fail": 1} and result.failure_reason == "no crash is tolerated here"
    assert result.goodput < 0.1


def test_the_jobs_restart_rule_applies():
    crashes = [crash_at(t, host) for host, t in enumerate((1_000.0, 2_000.0, 3_000.0))]
    capped = Simulation(job(max_restarts=2), COSTS, PolicyEngine()).run(crashes, DAY)
    assert capped.failure_reason is not None and "restart budget spent" in capped.failure_reason
    free = Simulation(job(), COSTS, PolicyEngine()).run(crashes, DAY)
    assert free.failure_reason is None and free.decisions == {"restart": 3}


def test_the_restart_from_persistent_baseline_loses_more_than_the_product():
    found = schedule(fleet_failures.LLAMA3, chips=4_096, host_count=1_024, seconds=10 * DAY, seed=1)
    shape = Job(JobShape(512, 2, 4), 1, 10, 100, 16, RestartRule(10**9))
    product = Simulation(shape, COSTS, PolicyEngine()).run(found, 10 * DAY)
    baseline = Simulation(shape, COSTS, None, mode=Mode.PERSISTENT_RESTART).run(found, 10 * DAY)
    assert 0.9 < product.goodput < 1.0 and baseline.goodput < product.goodput


def test_bad_settings_and_models_are_refused_naming_them(tmp_path):
    with pytest.raises(UserError, match="--cost 'speed=2'"):
        with_settings(COSTS, ["speed=2"])
    assert with_settings(COSTS, ["shard_gb=8"]).shard_gb == 8.0
    with pytest.raises(UserError, match="neither a model"):
        failure_model("meteors")
    (tmp_path / "bad.yaml").write_text("categories: [{name: x, per_chip_day: 1, effect: meteor}]")
    with pytest.raises(UserError, match=r"bad\.yaml: a failure model is"):
        failure_model(str(tmp_path / "bad.yaml"))


def test_simulate_prints_one_json_object_with_the_baselines():
    result = subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "slicekeeper.cli",
                "simulate",
                str(ROOT / "examples" / "trainingjob.yaml"),
            ),
            *("--chips", "4096", "--days", "5", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures.keys() >= {"goodput", "baselines", "badput_seconds", "decisions"}
    assert set(figures["baselines"]) == {
        "restart from persistent",
        "no spares",
        "plain ladder",
        "no spares, plain ladder",
    }
    assert figures["chips"] == 4096 and 0 < figures["goodput"] <= 1


def test_the_benchmark_prints_a_row_and_the_figures_of_each_size(capsys):
    from benchmarks import simulate as bench

    assert bench.main(["--chips", "512", "--days", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["chips", "days", "failures", "goodput"]
    assert lines[1].split()[0] == "512" and json.loads(lines[2])["chips"] == 512


def test_losing_the_leaders_machine_waits_for_its_lease_and_another_host_leads():
    """The leader's loss costs its lease's run-out and every host registering again with the next
    leader, at the job's size (the hand-over's line, benchmarks/control_plane_fit.py)."""

    def recovery(*hosts: int, costs: CostModel = COSTS) -> float:
        lost = [
            Failure(5_000.0 * (i + 1), h, Category("faulty chip", 0.0, Effect.HOST_LOST))
            for i, h in enumerate(hosts)
        ]
        result = Simulation(job(spares=4), costs, PolicyEngine()).run(lost, DAY, start={})
        return result.badput_seconds(3)[Badput.INFRASTRUCTURE_RECOVERY]

    hosts = job().shape.host_count
    difference = COSTS.leader_lost_detect_seconds - COSTS.lost_detect_seconds + COSTS.handover.at(hosts)
    assert COSTS.handover.at(hosts) > 0
    assert recovery(0) - recovery(3) == pytest.approx(difference, abs=1e-3)
    # Host 1 leads after host 0: its loss waits for the lease too; host 0's new machine does not lead.
    assert recovery(0, 1) - recovery(0, 3) == pytest.approx(difference, abs=1e-3)
    assert recovery(0, 0) - recovery(0, 3) == pytest.approx(0.0, abs=1e-3)
    # The hand-over grows with the job: a costlier line costs that much more, host by host.
    dearer = with_settings(COSTS, ["handover_per_host_seconds=0.01"])
    assert recovery(0, costs=dearer) - recovery(0) == pytest.approx(
        dearer.handover.at(hosts) - COSTS.handover.at(hosts), abs=1e-3
    )


def test_with_no_spare_the_priced_ladder_scales_down_when_a_slice_is_a_small_share_of_the_job():
    """Expected costs (context.expected_cost) against the plain ladder, which always waits for a new
    machine: dropping one slice of 64 for the 300 s a machine takes costs far less than stopping the
    whole job for it; with two slices, half the job idles and waiting 30 s for a machine wins."""
    lost = [Failure(5_000.0, 3, Category("faulty chip", 0.0, Effect.HOST_LOST))]
    many = job(slices=64, spares=0)
    priced = Simulation(many, COSTS, PolicyEngine()).run(lost, DAY)
    plain = Simulation(many, COSTS, PolicyEngine(), priced=False).run(lost, DAY)
    assert priced.decisions["scale_down"] == 1 and plain.decisions == {"replace": 1}
    assert priced.goodput > plain.goodput  # the gain the prices buy
    quick = with_settings(COSTS, ["replacement_seconds=30"])
    two = Simulation(job(slices=2, spares=0), quick, PolicyEngine()).run(lost, DAY)
    assert two.decisions == {"replace": 1}


def test_a_host_that_faulted_before_is_swapped_at_its_second_fault_when_a_spare_stands_by():
    crashes = [crash_at(5_000.0, host=1), crash_at(6_000.0, host=1)]  # within the restart window
    priced = Simulation(job(spares=2), COSTS, PolicyEngine()).run(crashes, DAY)
    plain = Simulation(job(spares=2), COSTS, PolicyEngine(), priced=False).run(crashes, DAY)
    assert priced.decisions == {"restart": 1, "replace": 1}
    assert plain.decisions == {"restart": 2}  # the plain ladder waits for the third (a crash loop)
