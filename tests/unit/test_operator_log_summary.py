"""Quiet operator logs (operator/log_summary.py): kopf's line per pod event becomes DEBUG, whatever
else kopf says keeps its level, and what was done for a job is said in one line per interval."""

from __future__ import annotations

import logging

import pytest
from slicekeeper.operator.log_summary import JobActivity, RoutineAtDebug

JOB = ("team", "llm")


def kopf_record(message: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("kopf.objects", level, __file__, 1, message, None, None)


@pytest.mark.parametrize(
    "message",
    [
        "Handler 'register.<locals>.node_event' succeeded.",
        "Timer 'register.<locals>.keep' succeeded.",
        "Handler 'node_event' succeeded.",
    ],
)
def test_the_routine_handlers_success_is_debug(message: str):
    quiet, record = RoutineAtDebug(shown=False), kopf_record(message)
    assert not quiet.filter(record)
    shown, record = RoutineAtDebug(shown=True), kopf_record(message)
    assert shown.filter(record) and (record.levelno, record.levelname) == (logging.DEBUG, "DEBUG")


@pytest.mark.parametrize(
    "message",
    [
        "Handler 'register.<locals>.reconcile' succeeded.",  # once per job: kept
        "Handler 'register.<locals>.node_event' failed with an exception and will try again in 60 seconds: x",
        "Handler 'register.<locals>.my_node_event_alike' succeeded.",
        "Creation is processed: 1 succeeded; 0 failed.",
    ],
)
def test_anything_else_keeps_its_level(message: str):
    record = kopf_record(message)
    assert RoutineAtDebug(shown=False).filter(record) and record.levelno == logging.INFO
    warning = kopf_record("Handler 'register.<locals>.node_event' succeeded.", logging.WARNING)
    assert RoutineAtDebug(shown=False).filter(warning) and warning.levelno == logging.WARNING


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_job_gets_one_line_per_interval_and_only_when_something_was_done():
    clock = Clock()
    activity = JobActivity(interval=60, clock=clock)
    assert activity.summary(JOB) is None  # nothing done: nothing said
    activity.note(JOB, "pod events", 3)
    activity.note(JOB, "pods created", 2)
    activity.note(JOB, "pods replaced", 0)  # none: not named
    assert activity.summary(JOB) == "job team/llm: 3 pod events, 2 pods created"
    activity.note(JOB, "pod events")
    clock.now += 30
    assert activity.summary(JOB) is None  # within the interval: held back, still counted
    activity.note(JOB, "pods replaced")
    clock.now += 30
    assert activity.summary(JOB) == "job team/llm: 1 pod events, 1 pods replaced in the last 60 s"
    clock.now += 600
    assert activity.summary(JOB) is None  # idle: nothing


def test_a_deleted_job_says_what_was_left_unsaid_and_is_forgotten():
    clock = Clock()
    activity = JobActivity(interval=60, clock=clock)
    activity.note(JOB, "pod events")
    assert activity.summary(JOB) is not None
    activity.note(JOB, "pod events", 4)
    assert activity.forget(JOB) == "job team/llm: 4 pod events before it was deleted"
    assert activity.forget(JOB) is None
    activity.note(JOB, "pod events")
    assert activity.summary(JOB) == "job team/llm: 1 pod events"  # a job of the same name: afresh
