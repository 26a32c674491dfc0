"""The restart state machine's pure transitions (supervisor.leader.restart_machine): states x events
in tables, and random event sequences that must never leave a job stopped with nothing pending."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slicekeeper.supervisor.leader import restart_machine as m
from slicekeeper.supervisor.leader.restart_machine import JobState
from slicekeeper.supervisor.leader.restart_rule import RestartRule

RULE = RestartRule(max_restarts=3, max_without_progress=2)
WORLD = (0, 1, 2)
ALL = frozenset(WORLD)


def ready(holding: bool = False, live: frozenset[int] = ALL) -> m.Readiness:
    return m.Readiness(live, WORLD, holding)


def fault(host: int = 1, planned: bool = False) -> m.FaultStop:
    return m.FaultStop(host, "crash", "workload exited with 1", 10.0, ALL, WORLD, planned)


RUNNING = m.RestartState(phase=JobState.RUNNING, generation=4, progressed=True)
STOPPING = dataclasses.replace(
    RUNNING, phase=JobState.STOPPING, progressed=False, restarts=1, ack_deadline=True
)


def kinds(commands: list[m.Command]) -> list[str]:
    return [type(c).__name__ for c in commands]


# --- states x events ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "event", "phase", "commands"),
    [
        # a fault stops every member of a running job, under the ack deadline
        (RUNNING, fault(), JobState.STOPPING, ["RecordStop", "WriteJournal", "SendStop", "ArmAckDeadline"]),
        # one stop per generation: a second fault while stopping changes nothing
        (STOPPING, fault(), JobState.STOPPING, []),
        # not started yet: nothing to stop
        (m.RestartState(), fault(), JobState.REGISTERING, []),
        # the last ack with nothing holding the start: the next generation starts
        (
            dataclasses.replace(STOPPING, stopped=frozenset({0, 1})),
            m.StopAcked(frozenset({2}), 4, ready()),
            JobState.STOPPING,
            ["CancelAckDeadline", "StartGeneration"],
        ),
        # the last ack while a decision holds the start: it waits
        (
            dataclasses.replace(STOPPING, stopped=frozenset({0, 1})),
            m.StopAcked(frozenset({2}), 4, ready(holding=True)),
            JobState.STOPPING,
            [],
        ),
        # an ack for another generation does not count
        (
            dataclasses.replace(STOPPING, stopped=frozenset({0, 1})),
            m.StopAcked(frozenset({2}), 3, ready()),
            JobState.STOPPING,
            [],
        ),
        # the decision is in: reconsidering starts the job
        (
            dataclasses.replace(STOPPING, stopped=ALL),
            m.Reconsider(ready()),
            JobState.STOPPING,
            ["CancelAckDeadline", "StartGeneration"],
        ),
        # the deadline with a member that never acked fails the job
        (
            dataclasses.replace(STOPPING, stopped=frozenset({0})),
            m.AckDeadlinePassed(4, ready(), 30.0),
            JobState.FAILED,
            ["CancelAckDeadline", "EndJob"],
        ),
        # the deadline with every ack in and a decision still holding: armed again
        (
            dataclasses.replace(STOPPING, stopped=ALL),
            m.AckDeadlinePassed(4, ready(holding=True), 30.0),
            JobState.STOPPING,
            ["ArmAckDeadline"],
        ),
        # ... and with nothing holding any more (its end went unnoticed): the start
        (
            dataclasses.replace(STOPPING, stopped=ALL),
            m.AckDeadlinePassed(4, ready(), 30.0),
            JobState.STOPPING,
            ["CancelAckDeadline", "StartGeneration"],
        ),
        # the deadline of an older generation: nothing
        (
            dataclasses.replace(STOPPING, stopped=frozenset()),
            m.AckDeadlinePassed(3, ready(), 30.0),
            JobState.STOPPING,
            [],
        ),
        # started: running the generation the driver started
        (dataclasses.replace(STOPPING, starting=True), m.Started(5), JobState.RUNNING, []),
        # every active host finished: the job succeeded
        (
            dataclasses.replace(RUNNING, finished=frozenset({0, 1})),
            m.HostFinished(2, 4, WORLD),
            JobState.SUCCEEDED,
            ["EndJob"],
        ),
        (
            dataclasses.replace(RUNNING, finished=frozenset({0, 1})),
            m.HostFinished(2, 3, WORLD),
            JobState.RUNNING,
            [],
        ),
        # a failure ends the job in any state but an end
        (STOPPING, m.JobFails("the policy said so"), JobState.FAILED, ["CancelAckDeadline", "EndJob"]),
        (RUNNING, m.JobFails("the policy said so"), JobState.FAILED, ["EndJob"]),
        (dataclasses.replace(RUNNING, phase=JobState.SUCCEEDED), m.JobFails("late"), JobState.SUCCEEDED, []),
        (dataclasses.replace(RUNNING, phase=JobState.FAILED), fault(), JobState.FAILED, []),
        # the first start: once, however often every host is found registered
        (m.RestartState(), m.AllRegistered(), JobState.REGISTERING, ["StartGeneration"]),
        (m.RestartState(starting=True), m.AllRegistered(), JobState.REGISTERING, []),
        (m.RestartState(starting=True), m.Started(0), JobState.RUNNING, []),
    ],
)
def test_each_state_answers_each_event_with_its_transition(state, event, phase, commands):
    after, issued = m.transition(state, event, RULE)
    assert after.phase is phase
    assert kinds(issued) == commands


def test_a_stop_tells_the_live_members_of_the_active_slices_what_stopped():
    event = m.FaultStop(2, "hang", "no progress", 5.0, frozenset({0, 2, 3}), (0, 1, 2), planned=False)
    after, commands = m.transition(RUNNING, event, RULE)
    [stop] = [c for c in commands if isinstance(c, m.SendStop)]
    assert stop == m.SendStop(generation=4, kind="hang", host=2, to=(0, 2))
    assert (after.restarts, after.stopped) == (1, frozenset())


def test_a_planned_stop_names_no_host_and_costs_no_restart_budget():
    spent = dataclasses.replace(RUNNING, restarts=3)  # the budget is spent
    after, commands = m.transition(spent, fault(planned=True), RULE)
    assert after.phase is JobState.STOPPING
    [stop] = [c for c in commands if isinstance(c, m.SendStop)]
    assert stop.host is None


def test_once_the_restart_budget_is_spent_a_fault_fails_the_job_with_the_reason():
    spent = dataclasses.replace(RUNNING, restarts=3)
    after, commands = m.transition(spent, fault(), RULE)
    assert after.phase is JobState.FAILED
    assert "restart budget spent: 3 in-job restarts" in (after.failure_reason or "")
    assert kinds(commands) == ["RecordStop", "EndJob"]
    assert commands[0] == m.RecordStop(1, "crash", "workload exited with 1", False, True, 4, 10.0)


def test_starts_without_progress_fail_the_job_before_the_budget_is_spent():
    state = dataclasses.replace(RUNNING, progressed=False, restarts_without_progress=1)
    after, _ = m.transition(state, fault(), RULE)
    assert after.phase is JobState.FAILED
    assert "no progress across 2 consecutive starts" in (after.failure_reason or "")


def test_a_completed_step_resets_the_starts_without_progress():
    state = dataclasses.replace(RUNNING, progressed=False, restarts_without_progress=1)
    state, _ = m.transition(state, m.Progressed(), RULE)
    after, _ = m.transition(state, fault(), RULE)
    assert (after.phase, after.restarts_without_progress) == (JobState.STOPPING, 0)


def test_a_lost_member_no_longer_counts_as_stopped_and_a_newcomer_has_nothing_to_stop():
    state = dataclasses.replace(STOPPING, stopped=frozenset({0, 1}))
    state, _ = m.transition(state, m.MemberLost(1), RULE)
    assert state.stopped == {0}
    state, _ = m.transition(state, m.NoWorkload(1), RULE)
    _, commands = m.transition(state, m.StopAcked(frozenset({2}), 4, ready()), RULE)
    assert kinds(commands) == ["CancelAckDeadline", "StartGeneration"]


def test_a_start_given_up_while_stopping_waits_again_under_its_deadline():
    state = dataclasses.replace(STOPPING, starting=True, ack_deadline=False)
    after, commands = m.transition(state, m.StartAbandoned(), RULE)
    assert (after.starting, after.ack_deadline, kinds(commands)) == (False, True, ["ArmAckDeadline"])


# --- random sequences: never stuck ---------------------------------------------------------------

HOSTS = st.sampled_from(WORLD)
CURRENT = -1
"""A generation the driver replaces by the running one: most events are about the generation now."""
GENERATIONS = st.sampled_from([CURRENT, CURRENT, CURRENT, 0, 1])
READINESS = st.builds(
    m.Readiness, live=st.frozensets(HOSTS).map(lambda s: s | {0}), world=st.just(WORLD), holding=st.booleans()
)
ACKS = st.builds(
    m.StopAcked,
    hosts=st.frozensets(HOSTS, min_size=1, max_size=3),
    generation=GENERATIONS,
    readiness=READINESS,
)
DEADLINES = st.builds(m.AckDeadlinePassed, generation=GENERATIONS, readiness=READINESS, seconds=st.just(30.0))
EVENTS = st.one_of(  # weighted towards what a restart is made of: faults, acks, deadlines
    st.builds(m.AllRegistered),
    st.builds(
        m.FaultStop,
        host=HOSTS,
        kind=st.sampled_from(["crash", "hang", "host_lost"]),
        detail=st.just("x"),
        t=st.just(1.0),
        live=st.just(ALL),
        world=st.just(WORLD),
        planned=st.booleans(),
    ),
    ACKS,
    ACKS,
    ACKS,
    DEADLINES,
    DEADLINES,
    st.builds(m.NoWorkload, host=HOSTS),
    st.builds(m.MemberLost, host=HOSTS),
    st.builds(m.Reconsider, readiness=READINESS),
    st.builds(m.StartAbandoned),
    st.builds(m.Progressed),
    st.builds(m.HostFinished, host=HOSTS, generation=GENERATIONS, world=st.just(WORLD)),
    st.builds(m.JobFails, reason=st.just("because")),
)


class Driver:
    """What the real driver does with the commands that lead to events: a start is carried out
    (it starts the next generation, or is given up), the rest is I/O with no event of its own."""

    def __init__(self) -> None:
        self.state = m.RestartState()
        self.starts_outstanding = 0

    def feed(self, event: m.Event, start_works: bool) -> None:
        if getattr(event, "generation", None) == CURRENT:
            event = dataclasses.replace(event, generation=self.state.generation)  # type: ignore[type-var]
        self.state, commands = m.transition(self.state, event, RULE)
        for command in commands:
            if isinstance(command, m.StartGeneration):
                first = self.state.phase is JobState.REGISTERING
                follow: m.Event = (
                    m.Started(self.state.generation + (0 if first else 1))
                    if start_works
                    else m.StartAbandoned()
                )
                self.feed(follow, start_works)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(EVENTS, st.booleans()), max_size=40))
def test_no_sequence_of_events_leaves_a_job_stopped_with_nothing_pending(steps):
    driver = Driver()
    for event, start_works in steps:
        driver.feed(event, start_works)
        assert m.pending(driver.state), f"stuck after {event}: {driver.state}"
        if driver.state.over:
            assert not (driver.state.ack_deadline or driver.state.starting)


def test_the_property_catches_a_machine_that_drops_its_deadline_while_waiting(monkeypatch):
    """Negative control: a deadline that is not armed again while a decision holds the start leaves
    a job stopped with nothing pending, and the check says so."""

    def forgetful(state: m.RestartState, event: m.AckDeadlinePassed) -> m.Outcome:
        return dataclasses.replace(state, ack_deadline=False), []

    monkeypatch.setattr(m, "_deadline", forgetful)
    driver = Driver()
    driver.state = dataclasses.replace(RUNNING)
    for event in (
        fault(),
        m.StopAcked(frozenset({0}), 4, ready(holding=True)),
        m.StopAcked(frozenset({1}), 4, ready(holding=True)),
        m.StopAcked(frozenset({2}), 4, ready(holding=True)),
        m.AckDeadlinePassed(4, ready(holding=True), 30.0),
    ):
        driver.feed(event, start_works=True)
    assert not m.pending(driver.state)
