"""No false alarm at any size: the hang allowance grows with what it times (supervisor/signals/hang.py), and a
host reports each silence once (supervisor/host/detectors.py).

The figures are the ones measured with `slicekeeper run examples/trainingjob.yaml --hosts 16
--devices-per-host 1` on a 2-core machine: a steady step of 0.5 s (p95 0.85 s, max 1.15 s), but the
steps right after the first of a start 1.5 to 2.2 s, step 2 up to 2.0 s with no step of the start
timed yet, against a 2 s floor.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from slicekeeper.supervisor import messages
from slicekeeper.supervisor.host.detectors import HangWatch
from slicekeeper.supervisor.metrics import SupervisorMetrics
from slicekeeper.supervisor.signals.hang import HangDetector

from slicekeeper.api import HealthSpec
from slicekeeper.goodput import GoodputAccountant
from slicekeeper.protocol import Phase

HEALTH = HealthSpec()  # floor 2 s, factor 3, 0.25 s per host for the first steps, startup 120 s

MEASURED_FIRST_STEPS_16_HOSTS = [1.09, 2.0, 1.33, 1.93, 2.01, 1.45, 0.57, 0.53]
"""Steps 1 to 8 of generation 0 on host 11 of a 16-host run (seconds)."""
STEP_2_SILENCE_16_HOSTS = 2.3
"""Step 2 a little slower than measured: the issue's runs went over the floor."""


def started(at: float, host_count: int) -> HangDetector:
    detector = HangDetector(HEALTH)
    detector.restart(at, host_count=host_count)
    return detector


def step(detector: HangDetector, begin: float, duration: float) -> float:
    detector.activity(begin, Phase.IDLE)
    detector.step_completed(begin + duration, duration)
    return begin + duration


# --- the first steps of a start -------------------------------------------------------------------
def test_step_2_of_a_16_host_start_may_take_longer_than_the_floor():
    detector = started(at=0.0, host_count=16)
    end = step(detector, 0.0, MEASURED_FIRST_STEPS_16_HOSTS[0])
    detector.activity(end, Phase.IDLE)  # step 2 begins; every host waits in it
    assert detector.limit() == pytest.approx(4.0)  # 0.25 s x 16 hosts
    assert not detector.hung(end + STEP_2_SILENCE_16_HOSTS)
    assert detector.hung(end + 4.1)  # a real hang in the first steps is still caught


def test_the_first_steps_of_a_4_host_start_keep_the_floor():
    detector = started(at=0.0, host_count=4)
    end = step(detector, 0.0, 1.0)
    detector.activity(end, Phase.IDLE)
    assert detector.limit() == pytest.approx(2.0)  # 0.25 s x 4 is below the floor
    assert detector.hung(end + 2.1)


def test_the_measured_first_steps_of_16_hosts_stay_within_the_limit():
    detector = started(at=0.0, host_count=16)
    now, limits = 0.0, []
    for duration in MEASURED_FIRST_STEPS_16_HOSTS:
        now = step(detector, now, duration)
        limits.append(detector.limit())  # the limit of the next step
    # The world's allowance until a step of the start is timed, then 3 x the slowest so far.
    assert limits == pytest.approx([4.0, 6.0, 6.0, 6.0, 6.03, 6.03, 6.03, 6.03])
    assert all(limit > d for limit, d in zip(limits[:-1], MEASURED_FIRST_STEPS_16_HOSTS[1:], strict=True))


def test_the_world_s_allowance_lasts_the_first_steps_after_the_first():
    detector = started(at=0.0, host_count=16)
    now, limits = 0.0, []
    for duration in [1.0, 0.5, 0.5, 0.5, 0.5]:
        now = step(detector, now, duration)
        limits.append(detector.limit())
    assert limits == pytest.approx([4.0, 4.0, 4.0, 2.0, 2.0])  # steps 2 to 4 (hang.WARMUP_STEPS)


def test_the_first_steps_allowance_is_never_more_than_the_startup_allowance():
    detector = started(at=0.0, host_count=25_000)
    step(detector, 0.0, 30.0)
    assert detector.limit() == pytest.approx(120.0)


def test_a_restart_brings_the_first_steps_allowance_back_for_the_new_world():
    detector = started(at=0.0, host_count=16)
    now = 0.0
    for duration in [1.0] + [0.5] * 10:
        now = step(detector, now, duration)
    assert detector.limit() == pytest.approx(2.0)
    detector.restart(100.0, host_count=32)  # e.g. scaled back up
    step(detector, 100.0, 5.0)
    assert detector.limit() == pytest.approx(8.0)


def test_the_limit_says_what_it_rests_on():
    detector = started(at=0.0, host_count=16)
    assert detector.allowance().basis == "the startup allowance"
    step(detector, 0.0, 1.0)
    assert detector.allowance().basis == "the first steps' allowance for 16 hosts"
    detector.activity(1.0, Phase.CHECKPOINT_SAVE)
    assert detector.allowance().basis == "the checkpoint_save phase allowance"


# --- the steady state follows the tail ------------------------------------------------------------
def steady(durations: list[float]) -> tuple[HangDetector, float]:
    """A detector after a compile step and `durations`, past its first steps (a world of 1), and the
    time the last of them ended."""
    detector = HangDetector(HEALTH)
    now = step(detector, 0.0, 30.0)
    for duration in durations:
        now = step(detector, now, duration)
    detector.activity(now, Phase.IDLE)
    return detector, now


MEASURED_STEADY_16_HOSTS = [0.5] * 24 + [0.85] * 6 + [1.15] * 2
"""32 steady steps of the 16-host run: median 0.5 s, p95 1.15 s."""


def test_the_steady_limit_follows_the_slow_steps_not_the_median():
    detector, end = steady(MEASURED_STEADY_16_HOSTS)
    assert detector.typical_step_seconds == pytest.approx(0.5)
    assert detector.limit() == pytest.approx(3 * 1.15)
    # A step 2.2 x the slowest recent one: within the factor, not a hang (3 x the median would be).
    assert not detector.hung(end + 2.5)
    assert detector.hung(end + 3.5)


def test_a_fast_steady_job_keeps_the_floor():
    detector, _ = steady([0.1] * 32)
    assert detector.limit() == pytest.approx(2.0)


# --- a host reports each silence once -------------------------------------------------------------
def test_a_host_reports_a_new_silence_after_its_workload_went_on():
    """The leader may find the job only slow: a later silence is a hang of its own."""
    health = HealthSpec(hang_timeout_floor_seconds=0.2, startup_timeout_seconds=0.2)
    detector = HangDetector(health)
    reports: list[messages.Fault] = []

    async def report(message: messages.MemberReport) -> None:
        assert isinstance(message, messages.Fault)
        reports.append(message)

    async def scenario() -> None:
        metrics = SupervisorMetrics(lambda: GoodputAccountant(0.0))
        watch = HangWatch(detector, metrics, report=report, watched=lambda: 0)
        task = asyncio.create_task(watch.run())
        detector.restart(time.time(), host_count=1)
        await asyncio.sleep(0.6)
        assert len(reports) == 1  # once for this silence, however long it lasts
        assert "limit 0.2 s, the startup allowance" in reports[0].detail
        detector.step_completed(time.time(), None)  # it went on
        await asyncio.sleep(0.1)
        assert len(reports) == 1
        await asyncio.sleep(0.5)
        assert len(reports) == 2  # a new silence
        task.cancel()

    asyncio.run(scenario())
