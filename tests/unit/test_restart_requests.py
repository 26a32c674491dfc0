"""What the restart machine asks an event's sender to do (supervisor.leader.restart_machine's requests):
a lost host, a registration, a member back, a policy's decision and capacity coming back are decided
by the machine from its state, and the leader's parts carry out the answer (leader.remediation,
leader.registrations) instead of reading the job's phase themselves."""

from __future__ import annotations

import dataclasses

import pytest
from slicekeeper.supervisor.leader import restart_events as ev
from slicekeeper.supervisor.leader import restart_machine as m
from slicekeeper.supervisor.leader.admission import Admission, Back, HostState, Joining, Step
from slicekeeper.supervisor.leader.remedies import HoldFor, StopFirst
from slicekeeper.supervisor.leader.restart_rule import RestartRule
from slicekeeper.supervisor.leader.restart_state import DECIDING, JobState, RestartState

from slicekeeper import policy

RULE = RestartRule(max_restarts=3, max_without_progress=2)
WORLD = (0, 1, 2, 3)
ALL = frozenset(WORLD)

REGISTERING = RestartState()
RUNNING = RestartState(phase=JobState.RUNNING, generation=2, progressed=True)
STOPPING = dataclasses.replace(
    RUNNING, phase=JobState.STOPPING, progressed=False, restarts=1, ack_deadline=True
)
SUCCEEDED = dataclasses.replace(RUNNING, phase=JobState.SUCCEEDED)
FAILED = dataclasses.replace(RUNNING, phase=JobState.FAILED, failure_reason="too many restarts")


def lost(host: int = 1) -> ev.HostLost:
    return ev.HostLost(host, "connection dropped", 10.0, ALL - {host}, WORLD)


def names(commands: list[ev.Command | ev.Request]) -> list[str]:
    return [type(c).__name__ for c in commands]


# --- a lost host ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "phase", "commands"),
    [
        # running: a fault like any, every other member stopped, then the policy decides
        (
            RUNNING,
            JobState.STOPPING,
            ["RecordStop", "WriteJournal", "SendStop", "ArmAckDeadline", "DecideOnLoss"],
        ),
        # stopping already: one stop per generation; noted, and the policy decides on it too
        (STOPPING, JobState.STOPPING, ["NoteLoss", "DecideOnLoss"]),
        # before the first start nothing trained: a new machine must stand in
        (REGISTERING, JobState.REGISTERING, ["NoteLoss", "StandIn"]),
        # an ended job changes no more
        (SUCCEEDED, JobState.SUCCEEDED, []),
        (FAILED, JobState.FAILED, []),
    ],
    ids=["running", "stopping", "registering", "succeeded", "failed"],
)
def test_a_lost_host_is_stopped_for_decided_on_or_stood_in_for_by_phase(state, phase, commands):
    after, said = m.transition(state, lost(), RULE)
    assert after.phase is phase
    assert names(said) == commands
    for request in said:
        if isinstance(request, (ev.NoteLoss, ev.StandIn, ev.DecideOnLoss)):
            assert request.host == 1


def test_a_lost_host_that_exhausts_the_restarts_fails_the_job_and_asks_no_decision():
    spent = dataclasses.replace(RUNNING, restarts=RULE.max_restarts)
    after, said = m.transition(spent, lost(), RULE)
    assert after.phase is JobState.FAILED
    assert "DecideOnLoss" not in names(said) and names(said)[-1] == "EndJob"


def test_a_lost_host_stops_only_the_members_still_connected():
    _, said = m.transition(RUNNING, lost(2), RULE)
    [stop] = [c for c in said if isinstance(c, ev.SendStop)]
    assert stop.to == (0, 1, 3) and stop.host == 2 and stop.kind == "host_lost"


# --- registrations --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "joining", "admission"),
    [
        (REGISTERING, Joining.HOST, Admission.AWAITED),
        (RUNNING, Joining.HOST, Admission.LATE),
        (STOPPING, Joining.REJOINING, Admission.REJOIN),
        (RUNNING, Joining.RESTARTED, Admission.RESTARTED),
        # an ended job answers too: told to shut down, or why it failed
        (SUCCEEDED, Joining.REJOINING, Admission.TOO_LATE),
        (FAILED, Joining.HOST, Admission.REFUSED),
    ],
)
def test_a_registration_is_admitted_by_the_machine_in_every_phase(state, joining, admission):
    after, said = m.transition(state, ev.Joins(joining), RULE)
    assert after == state
    assert said == [ev.Admit(admission)]


def test_the_last_host_registered_starts_the_job_and_one_before_it_waits():
    back = Back(Joining.HOST, takes_part=True)
    waiting, said = m.transition(REGISTERING, ev.Registered(3, 4, back), RULE)
    assert (waiting, said) == (REGISTERING, [])
    starting, said = m.transition(REGISTERING, ev.Registered(4, 4, back), RULE)
    assert starting.starting and said == [ev.StartGeneration(first=True)]
    # a second one while the first start reads the persistent tier starts nothing more
    assert m.transition(starting, ev.Registered(4, 4, back), RULE) == (starting, [])


def test_a_host_registering_after_the_start_is_served_again_as_the_rules_say():
    back = Back(Joining.HOST, takes_part=True)
    _, said = m.transition(RUNNING, ev.Registered(4, 4, back), RULE)
    [serve] = said
    assert isinstance(serve, ev.ServeAgain)
    assert serve.answer.steps == (Step.STOP_AS_LOST, Step.NO_WORKLOAD, Step.RECONSIDER)
    _, said = m.transition(STOPPING, ev.Registered(4, 4, back), RULE)
    assert said == [ev.ServeAgain(dataclasses.replace(serve.answer, steps=(Step.RECONSIDER,)))]


def test_a_member_back_is_told_what_the_phase_asks():
    rejoining = Back(Joining.REJOINING, takes_part=True)
    _, running = m.transition(RUNNING, ev.Returns(rejoining), RULE)
    _, stopping = m.transition(STOPPING, ev.Returns(rejoining), RULE)
    [running_answer], [stopping_answer] = running, stopping
    assert isinstance(running_answer, ev.ServeAgain) and isinstance(stopping_answer, ev.ServeAgain)
    assert (running_answer.answer.state, running_answer.answer.steps) == (HostState.TRAINING, ())
    assert stopping_answer.answer.steps == (Step.STOP_WITH_THE_REST,)


# --- decisions and capacity -----------------------------------------------------------------------


def _host_lost_event() -> policy.HostLost:
    return policy.HostLost(t=10.0, step=40, generation=2, host=1, machine="host-1")


def test_a_decision_made_while_running_stops_the_job_before_the_world_changes():
    action = policy.ReplaceHost(host=1)
    _, said = m.transition(RUNNING, ev.Decided(_host_lost_event(), action), RULE)
    [carry] = said
    assert isinstance(carry, ev.Carry)
    [stop, replace] = carry.intents
    assert isinstance(stop, StopFirst) and stop.host == 1 and replace == action


def test_a_decision_made_while_stopped_changes_the_world_at_once_and_a_wait_holds_the_start():
    _, said = m.transition(STOPPING, ev.Decided(_host_lost_event(), policy.ReplaceHost(host=1)), RULE)
    assert said == [ev.Carry((policy.ReplaceHost(host=1),))]
    _, said = m.transition(STOPPING, ev.Decided(_host_lost_event(), policy.Wait(seconds=5.0)), RULE)
    assert said == [ev.Carry((HoldFor(5.0, holds=True),))]


def test_a_decision_on_an_ended_job_is_carried_out_by_nothing():
    assert m.transition(FAILED, ev.Decided(_host_lost_event(), policy.ReplaceHost(host=1)), RULE) == (
        FAILED,
        [],
    )


@pytest.mark.parametrize(
    ("state", "offered"),
    [
        (RUNNING, True),
        # not trained a step yet in this generation, stopped, or a decision under way: offered later
        (dataclasses.replace(RUNNING, progressed=False), False),
        (STOPPING, False),
        (dataclasses.replace(RUNNING, holds=(DECIDING,)), False),
        (REGISTERING, False),
        (SUCCEEDED, False),
    ],
    ids=["training", "no-step-yet", "stopping", "deciding", "registering", "ended"],
)
def test_capacity_is_offered_to_the_policy_only_while_the_job_trains(state, offered):
    after, said = m.transition(state, ev.CapacityOffered(), RULE)
    assert after == state
    assert said == ([ev.OfferCapacity()] if offered else [])
