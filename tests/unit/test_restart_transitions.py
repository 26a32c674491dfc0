"""The restart state machine's pure transitions (supervisor.leader.restart_machine): states x events
in tables. Random sequences of events, with safety and liveness checked and mutants of the machine as
negative controls, are in test_restart_properties.py."""

from __future__ import annotations

import dataclasses

import pytest
from slicekeeper.supervisor.leader import restart_events as ev
from slicekeeper.supervisor.leader import restart_machine as m
from slicekeeper.supervisor.leader.restart_rule import RestartRule
from slicekeeper.supervisor.leader.restart_state import JobState

RULE = RestartRule(max_restarts=3, max_without_progress=2)
WORLD = (0, 1, 2)
ALL = frozenset(WORLD)


def ready(holding: bool = False, live: frozenset[int] = ALL) -> m.Readiness:
    return m.Readiness(live, WORLD, holding)


def fault(host: int = 1, planned: bool = False) -> ev.FaultStop:
    return ev.FaultStop(host, "crash", "workload exited with 1", 10.0, ALL, WORLD, planned)


RUNNING = m.RestartState(phase=JobState.RUNNING, generation=4, progressed=True)
STOPPING = dataclasses.replace(
    RUNNING, phase=JobState.STOPPING, progressed=False, restarts=1, ack_deadline=True
)


def kinds(commands: list[ev.Command]) -> list[str]:
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
            ev.StopAcked(frozenset({2}), 4, ready()),
            JobState.STOPPING,
            ["CancelAckDeadline", "StartGeneration"],
        ),
        # the last ack while a decision holds the start: it waits
        (
            dataclasses.replace(STOPPING, stopped=frozenset({0, 1})),
            ev.StopAcked(frozenset({2}), 4, ready(holding=True)),
            JobState.STOPPING,
            [],
        ),
        # an ack for another generation does not count
        (
            dataclasses.replace(STOPPING, stopped=frozenset({0, 1})),
            ev.StopAcked(frozenset({2}), 3, ready()),
            JobState.STOPPING,
            [],
        ),
        # the decision is in: reconsidering starts the job
        (
            dataclasses.replace(STOPPING, stopped=ALL),
            ev.Reconsider(ready()),
            JobState.STOPPING,
            ["CancelAckDeadline", "StartGeneration"],
        ),
        # the deadline with a member that never acked fails the job
        (
            dataclasses.replace(STOPPING, stopped=frozenset({0})),
            ev.AckDeadlinePassed(4, ready(), 30.0),
            JobState.FAILED,
            ["CancelAckDeadline", "EndJob"],
        ),
        # the deadline with every ack in and a decision still holding: armed again
        (
            dataclasses.replace(STOPPING, stopped=ALL),
            ev.AckDeadlinePassed(4, ready(holding=True), 30.0),
            JobState.STOPPING,
            ["ArmAckDeadline"],
        ),
        # ... and with nothing holding any more (its end went unnoticed): the start
        (
            dataclasses.replace(STOPPING, stopped=ALL),
            ev.AckDeadlinePassed(4, ready(), 30.0),
            JobState.STOPPING,
            ["CancelAckDeadline", "StartGeneration"],
        ),
        # the deadline of an older generation: nothing
        (
            dataclasses.replace(STOPPING, stopped=frozenset()),
            ev.AckDeadlinePassed(3, ready(), 30.0),
            JobState.STOPPING,
            [],
        ),
        # started: running the generation the driver started
        (dataclasses.replace(STOPPING, starting=True), ev.Started(5), JobState.RUNNING, []),
        # every active host finished: the job succeeded
        (
            dataclasses.replace(RUNNING, finished=frozenset({0, 1})),
            ev.HostFinished(2, 4, WORLD),
            JobState.SUCCEEDED,
            ["EndJob"],
        ),
        (
            dataclasses.replace(RUNNING, finished=frozenset({0, 1})),
            ev.HostFinished(2, 3, WORLD),
            JobState.RUNNING,
            [],
        ),
        # a failure ends the job in any state but an end
        (STOPPING, ev.JobFails("the policy said so"), JobState.FAILED, ["CancelAckDeadline", "EndJob"]),
        (RUNNING, ev.JobFails("the policy said so"), JobState.FAILED, ["EndJob"]),
        (dataclasses.replace(RUNNING, phase=JobState.SUCCEEDED), ev.JobFails("late"), JobState.SUCCEEDED, []),
        (dataclasses.replace(RUNNING, phase=JobState.FAILED), fault(), JobState.FAILED, []),
        # the first start: once, however often every host is found registered
        (m.RestartState(), ev.AllRegistered(), JobState.REGISTERING, ["StartGeneration"]),
        (m.RestartState(starting=True), ev.AllRegistered(), JobState.REGISTERING, []),
        (m.RestartState(starting=True), ev.Started(0), JobState.RUNNING, []),
    ],
)
def test_each_state_answers_each_event_with_its_transition(state, event, phase, commands):
    after, issued = m.transition(state, event, RULE)
    assert after.phase is phase
    assert kinds(issued) == commands


def test_a_stop_tells_the_live_members_of_the_active_slices_what_stopped():
    event = ev.FaultStop(2, "hang", "no progress", 5.0, frozenset({0, 2, 3}), (0, 1, 2), planned=False)
    after, commands = m.transition(RUNNING, event, RULE)
    [stop] = [c for c in commands if isinstance(c, ev.SendStop)]
    assert stop == ev.SendStop(generation=4, kind="hang", host=2, to=(0, 2))
    assert (after.restarts, after.stopped) == (1, frozenset())


def test_a_planned_stop_names_no_host_and_costs_no_restart_budget():
    spent = dataclasses.replace(RUNNING, restarts=3)  # the budget is spent
    after, commands = m.transition(spent, fault(planned=True), RULE)
    assert after.phase is JobState.STOPPING
    [stop] = [c for c in commands if isinstance(c, ev.SendStop)]
    assert stop.host is None


def test_once_the_restart_budget_is_spent_a_fault_fails_the_job_with_the_reason():
    spent = dataclasses.replace(RUNNING, restarts=3)
    after, commands = m.transition(spent, fault(), RULE)
    assert after.phase is JobState.FAILED
    assert "restart budget spent: 3 in-job restarts" in (after.failure_reason or "")
    assert kinds(commands) == ["RecordStop", "EndJob"]
    assert commands[0] == ev.RecordStop(1, "crash", "workload exited with 1", False, True, 4, 10.0)


def test_starts_without_progress_fail_the_job_before_the_budget_is_spent():
    state = dataclasses.replace(RUNNING, progressed=False, restarts_without_progress=1)
    after, _ = m.transition(state, fault(), RULE)
    assert after.phase is JobState.FAILED
    assert "no progress across 2 consecutive starts" in (after.failure_reason or "")


def test_a_completed_step_resets_the_starts_without_progress():
    state = dataclasses.replace(RUNNING, progressed=False, restarts_without_progress=1)
    state, _ = m.transition(state, ev.Progressed(), RULE)
    after, _ = m.transition(state, fault(), RULE)
    assert (after.phase, after.restarts_without_progress) == (JobState.STOPPING, 0)


def test_a_lost_member_no_longer_counts_as_stopped_and_a_newcomer_has_nothing_to_stop():
    state = dataclasses.replace(STOPPING, stopped=frozenset({0, 1}))
    state, _ = m.transition(state, ev.MemberLost(1), RULE)
    assert state.stopped == {0}
    state, _ = m.transition(state, ev.NoWorkload(1), RULE)
    _, commands = m.transition(state, ev.StopAcked(frozenset({2}), 4, ready()), RULE)
    assert kinds(commands) == ["CancelAckDeadline", "StartGeneration"]


@pytest.mark.parametrize(
    ("state", "kind", "stops"),
    [
        (STOPPING, "crash", True),  # the restart under way when the leader was lost: stopped again
        (STOPPING, None, False),  # no cause in the journal carried on: nothing to say
        (RUNNING, "crash", False),
        (m.RestartState(), None, False),
    ],
)
def test_a_new_leader_sends_a_stop_under_way_again_to_every_member_back(state, kind, stops):
    after, commands = m.transition(state, ev.TookOver(kind, (0, 2, 3)), RULE)
    assert after == state
    assert commands == ([ev.SendStop(generation=4, kind=kind, host=None, to=(0, 2, 3))] if stops else [])


def test_only_the_start_from_registration_is_the_first():
    _, commands = m.transition(m.RestartState(), ev.AllRegistered(), RULE)
    assert commands == [ev.StartGeneration(first=True)]
    stopping = dataclasses.replace(STOPPING, stopped=frozenset({0, 1}))
    _, commands = m.transition(stopping, ev.StopAcked(frozenset({2}), 4, ready()), RULE)
    assert ev.StartGeneration(first=False) in commands


def test_a_start_given_up_while_stopping_waits_again_under_its_deadline():
    state = dataclasses.replace(STOPPING, starting=True, ack_deadline=False)
    after, commands = m.transition(state, ev.StartAbandoned(), RULE)
    assert (after.starting, after.ack_deadline, kinds(commands)) == (False, True, ["ArmAckDeadline"])


@pytest.mark.parametrize(
    ("phase", "generation", "runs", "stops"),
    [
        (JobState.RUNNING, 3, True, False),
        (JobState.RUNNING, 2, False, False),  # a report of a generation torn down: late
        (JobState.STOPPING, 3, False, True),
        (JobState.STOPPING, 4, False, False),
        (JobState.REGISTERING, 3, False, False),
        (JobState.SUCCEEDED, 3, False, False),
    ],
)
def test_only_the_generation_in_hand_counts(phase, generation, runs, stops):
    state = m.RestartState(phase=phase, generation=3)
    assert state.runs(generation) is runs and state.stops(generation) is stops
