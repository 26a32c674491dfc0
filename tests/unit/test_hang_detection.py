"""The hang detector allows silence according to what the workload is doing, never a fixed timeout."""

import pytest
from slicekeeper.supervisor.signals.hang import HangDetector

from slicekeeper.api import HealthSpec
from slicekeeper.protocol import Phase

HEALTH = HealthSpec(
    hang_timeout_floor_seconds=2.0,
    hang_timeout_factor=3.0,
    startup_timeout_seconds=120.0,
    phase_timeout_seconds=60.0,
)


def started(at: float = 1000.0, health: HealthSpec = HEALTH) -> HangDetector:
    detector = HangDetector(health)
    detector.restart(at, host_count=1)
    return detector


def run_steps(detector: HangDetector, durations: list[float], start: float) -> float:
    """Complete one step per duration, back to back; return the time the last one ended."""
    now = start
    for duration in durations:
        detector.activity(now, Phase.IDLE)
        now += duration
        detector.step_completed(now, duration)
    return now


def test_before_the_first_completed_step_the_startup_allowance_applies():
    detector = started(at=1000.0)
    assert detector.limit() == pytest.approx(120.0)
    assert not detector.hung(1119.0)
    assert detector.hung(1121.0)


def test_a_step_that_began_but_never_ended_is_still_startup():
    detector = started(at=1000.0)
    detector.activity(1005.0, Phase.IDLE)  # step 1 began: compiling
    assert detector.limit() == pytest.approx(120.0)
    assert not detector.hung(1100.0)


def test_silence_is_counted_from_the_last_event():
    detector = started(at=1000.0)
    detector.activity(1050.0)
    assert detector.silent_for(1070.0) == pytest.approx(20.0)
    assert not detector.hung(1169.0)
    assert detector.hung(1171.0)


def test_a_restore_phase_during_startup_keeps_the_startup_allowance():
    detector = started(at=1000.0)
    detector.activity(1001.0, Phase.CHECKPOINT_RESTORE)
    assert detector.limit() == pytest.approx(120.0)


def test_after_the_first_step_the_floor_applies_to_a_fast_job():
    detector = started(at=0.0)
    end = run_steps(detector, [30.0, 0.1, 0.1, 0.1], start=0.0)  # compile, then fast steps
    assert detector.limit() == pytest.approx(2.0)  # 3 x 0.1 is below the floor
    assert not detector.hung(end + 1.9)
    assert detector.hung(end + 2.1)


def test_a_slow_job_gets_factor_times_its_slow_steps():
    detector = started(at=0.0)
    run_steps(detector, [100.0, 10.0, 12.0, 11.0], start=0.0)
    assert detector.typical_step_seconds == pytest.approx(11.0)  # the median, for the report
    assert detector.limit() == pytest.approx(36.0)  # 3 x the tail


def test_a_single_outlier_among_the_recent_steps_does_not_set_the_limit():
    detector = started(at=0.0)
    run_steps(detector, [5.0] + [1.0] * 29 + [50.0], start=0.0)
    assert detector.typical_step_seconds == pytest.approx(1.0)
    assert detector.limit() == pytest.approx(3.0)


def test_only_the_recent_steps_make_the_typical_step_time():
    detector = HangDetector(HEALTH, window=4)
    detector.restart(0.0, host_count=1)
    run_steps(detector, [1.0, 10.0, 10.0, 10.0, 10.0, 2.0, 2.0, 2.0, 2.0], start=0.0)
    assert detector.typical_step_seconds == pytest.approx(2.0)
    assert detector.limit() == pytest.approx(6.0)


def test_the_first_step_of_a_start_is_not_a_typical_step():
    detector = started(at=0.0)
    run_steps(detector, [40.0], start=0.0)
    assert detector.typical_step_seconds is None
    assert detector.limit() == pytest.approx(2.0)  # the compile time does not inflate the limit
    run_steps(detector, [1.0], start=40.0)
    assert detector.typical_step_seconds == pytest.approx(1.0)


def test_a_step_without_a_known_duration_is_not_typical_but_ends_startup():
    detector = started(at=0.0)
    detector.step_completed(5.0, None)
    detector.step_completed(6.0, None)
    assert detector.typical_step_seconds is None
    assert detector.limit() == pytest.approx(2.0)


def test_inside_a_non_step_phase_the_phase_allowance_applies():
    detector = started(at=0.0)
    end = run_steps(detector, [10.0, 1.0, 1.0], start=0.0)
    detector.activity(end, Phase.CHECKPOINT_SAVE)
    assert detector.limit() == pytest.approx(60.0)
    assert not detector.hung(end + 59.0)
    assert detector.hung(end + 61.0)


@pytest.mark.parametrize(
    "phase",
    [
        Phase.CHECKPOINT_SAVE,
        Phase.CHECKPOINT_RESTORE,
        Phase.DATA_LOADING,
        Phase.TRAINING_PREP,
        Phase.TEARDOWN,
    ],
)
def test_every_reported_phase_gets_the_phase_allowance(phase):
    detector = started(at=0.0)
    run_steps(detector, [10.0, 1.0], start=0.0)
    detector.activity(20.0, phase)
    assert detector.limit() == pytest.approx(60.0)


def test_leaving_a_phase_brings_the_step_limit_back():
    detector = started(at=0.0)
    end = run_steps(detector, [10.0, 5.0, 5.0], start=0.0)
    detector.activity(end, Phase.CHECKPOINT_SAVE)
    detector.activity(end + 30.0, Phase.IDLE)
    assert detector.limit() == pytest.approx(15.0)
    assert detector.hung(end + 30.0 + 16.0)


def test_an_event_without_a_phase_keeps_the_current_phase():
    detector = started(at=0.0)
    run_steps(detector, [10.0, 1.0], start=0.0)
    detector.activity(20.0, Phase.CHECKPOINT_SAVE)
    detector.activity(25.0)
    assert detector.limit() == pytest.approx(60.0)


def test_restart_brings_the_startup_allowance_back():
    detector = started(at=0.0)
    end = run_steps(detector, [10.0, 1.0, 1.0], start=0.0)
    detector.activity(end, Phase.CHECKPOINT_SAVE)
    assert detector.limit() == pytest.approx(60.0)
    detector.restart(500.0, host_count=1)
    assert detector.limit() == pytest.approx(120.0)
    assert detector.silent_for(510.0) == pytest.approx(10.0)
    assert not detector.hung(619.0)
    assert detector.hung(621.0)


def test_the_first_step_after_a_restart_is_not_typical_either():
    detector = started(at=0.0)
    run_steps(detector, [10.0, 1.0, 1.0], start=0.0)
    detector.restart(100.0, host_count=1)
    run_steps(detector, [90.0], start=100.0)  # recompiling after the restart
    assert detector.typical_step_seconds == pytest.approx(1.0)
    assert detector.limit() == pytest.approx(3.0)
    assert detector.limit() < 120.0


def test_the_settings_come_from_the_health_spec():
    health = HealthSpec(
        hang_timeout_floor_seconds=0.5,
        hang_timeout_factor=10.0,
        startup_timeout_seconds=7.0,
        phase_timeout_seconds=4.0,
    )
    detector = started(at=0.0, health=health)
    assert detector.limit() == pytest.approx(7.0)
    run_steps(detector, [3.0, 0.2, 0.2], start=0.0)
    assert detector.limit() == pytest.approx(2.0)
    detector.activity(10.0, Phase.DATA_LOADING)
    assert detector.limit() == pytest.approx(4.0)
