"""The goodput accountant attributes every second to exactly one category."""

import pytest

from slicekeeper.goodput import Category, GoodputAccountant, ideal_step_seconds


def test_seconds_add_up_to_wall_time():
    acc = GoodputAccountant(start=100.0)
    acc.switch(Category.TPU_INITIALIZATION, 101.0)
    acc.begin_step(1, 102.0, first_of_start=True)
    acc.end_step(1, 104.0)
    acc.begin_step(2, 104.0, first_of_start=False)
    acc.end_step(2, 105.0)
    seconds = acc.seconds(106.0)
    assert sum(seconds.values()) == pytest.approx(6.0)
    assert seconds[Category.PROGRAM_STARTUP] == pytest.approx(1.0 + 2.0)  # process start + compiling step
    assert seconds[Category.PRODUCTIVE] == pytest.approx(1.0)
    assert acc.goodput(106.0) == pytest.approx(1 / 6)


def test_steps_executed_again_after_a_restore_are_wasted_progress():
    acc = GoodputAccountant(start=0.0)
    for step in range(1, 6):
        acc.begin_step(step, float(step), first_of_start=step == 1)
        acc.end_step(step, step + 1.0)
    acc.interrupt(6.5)  # the job is restored to step 3
    acc.begin_step(4, 8.0, first_of_start=True)
    acc.end_step(4, 9.0)
    acc.begin_step(5, 9.0, first_of_start=False)
    acc.end_step(5, 10.0)
    acc.begin_step(6, 10.0, first_of_start=False)
    acc.end_step(6, 11.0)
    seconds = acc.seconds(11.0)
    assert seconds[Category.WASTED_PROGRESS] == pytest.approx(1.0)  # step 5 again
    assert seconds[Category.PRODUCTIVE] == pytest.approx(5.0)  # steps 2-5 the first time, then 6
    assert seconds[Category.PROGRAM_STARTUP] == pytest.approx(
        3.0
    )  # process start, then two compiling first steps
    assert acc.high_water == 6


def test_an_interrupted_step_and_the_restart_are_infrastructure_recovery():
    acc = GoodputAccountant(start=0.0)
    acc.begin_step(1, 0.0, first_of_start=False)
    acc.interrupt(3.0)  # the step never ended: hung, then stopped
    acc.switch(Category.PROGRAM_STARTUP, 5.0)
    seconds = acc.seconds(5.0)
    assert seconds[Category.INFRASTRUCTURE_RECOVERY] == pytest.approx(5.0)
    assert seconds[Category.PRODUCTIVE] == 0.0


def test_a_parked_host_stopped_at_the_end_keeps_its_idle_time_as_scaled_down():
    acc = GoodputAccountant(start=0.0)
    acc.switch(Category.SCALED_DOWN, 2.0)
    acc.interrupt(10.0)  # the job failed while the host was parked: it had no workload to lose
    assert acc.seconds(10.0)[Category.SCALED_DOWN] == pytest.approx(8.0)
    assert acc.seconds(10.0)[Category.INFRASTRUCTURE_RECOVERY] == 0.0


def test_settled_seconds_leave_out_what_a_fault_could_still_book_as_recovery():
    acc = GoodputAccountant(start=0.0)
    acc.begin_step(1, 0.0, first_of_start=False)
    assert acc.settled_seconds(2.0)[Category.PRODUCTIVE] == 0.0  # the step may yet hang
    acc.interrupt(3.0)
    settled = acc.settled_seconds(5.0)
    assert settled[Category.PRODUCTIVE] == 0.0
    assert settled[Category.INFRASTRUCTURE_RECOVERY] == pytest.approx(5.0)  # open, but no fault re-books it
    acc.switch(Category.PROGRAM_STARTUP, 5.0)
    acc.begin_step(2, 6.0, first_of_start=False)
    acc.end_step(2, 7.0)
    assert acc.settled_seconds(9.0) == {**acc.seconds(9.0), Category.OTHER: 0.0}  # closed: settled


def test_ideal_step_time_ignores_outliers():
    assert ideal_step_seconds([1.0, 1.0, 1.1, 0.9, 30.0]) == pytest.approx(1.0)
    assert ideal_step_seconds([]) is None


def test_each_closed_interval_is_told_with_the_category_it_was_finally_booked_to():
    booked: list[tuple[Category, float, float]] = []
    acc = GoodputAccountant(start=0.0, booked=lambda *interval: booked.append(interval))
    acc.begin_step(1, 1.0, first_of_start=True)
    acc.end_step(1, 2.0)
    acc.begin_step(2, 2.0, first_of_start=False)
    acc.interrupt(5.0)  # step 2 never ended: its time is recovery, not productive
    acc.switch(Category.PROGRAM_STARTUP, 6.0)
    before = acc.seconds(7.0)
    acc.book_open(7.0)  # the account ends: its open interval is told too, and the totals stay
    assert acc.seconds(7.0) == before and acc.current is Category.PROGRAM_STARTUP
    assert booked == [
        (Category.PROGRAM_STARTUP, 0.0, 1.0),
        (Category.PROGRAM_STARTUP, 1.0, 2.0),  # the first step of a start compiles
        (Category.INFRASTRUCTURE_RECOVERY, 2.0, 5.0),
        (Category.INFRASTRUCTURE_RECOVERY, 5.0, 6.0),
        (Category.PROGRAM_STARTUP, 6.0, 7.0),
    ]
    told: dict[Category, float] = {}
    for category, start, end in booked:
        told[category] = told.get(category, 0.0) + end - start
    assert told == {c: s for c, s in acc.seconds(7.0).items() if s}  # the same account, interval by interval
