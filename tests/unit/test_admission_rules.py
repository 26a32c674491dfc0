"""The rules for who joins the leader and what the job does about a host served again
(supervisor/leader/admission.py), as tables: every phase of the job against every kind of registration,
and every fact about a host back. The leader's runs over TCP (test_supervisor_restart.py,
test_cluster_replacement.py, test_elastic_world.py, test_restart_records.py) carry the answers out."""

from __future__ import annotations

import pytest
from slicekeeper.supervisor.leader.admission import (
    UNKNOWN_CAUSE,
    Admission,
    Answer,
    Back,
    HostState,
    Joining,
    Step,
    admit,
    all_registered,
    back,
)
from slicekeeper.supervisor.leader.restart_state import JobState

from slicekeeper.policy.events import FaultKind

R, S = JobState.RUNNING, JobState.STOPPING

ADMISSIONS = {
    (JobState.REGISTERING, Joining.HOST): Admission.AWAITED,
    (JobState.REGISTERING, Joining.REJOINING): Admission.AWAITED,  # a new leader not started yet
    (JobState.REGISTERING, Joining.RESTARTED): Admission.AWAITED,
    (R, Joining.HOST): Admission.LATE,
    (R, Joining.REJOINING): Admission.REJOIN,
    (R, Joining.RESTARTED): Admission.RESTARTED,
    (S, Joining.HOST): Admission.LATE,
    (S, Joining.REJOINING): Admission.REJOIN,
    (S, Joining.RESTARTED): Admission.RESTARTED,
    **{(JobState.SUCCEEDED, joining): Admission.TOO_LATE for joining in Joining},
    **{(JobState.FAILED, joining): Admission.REFUSED for joining in Joining},
}


@pytest.mark.parametrize(("phase", "joining"), list(ADMISSIONS))
def test_each_registration_is_answered_by_the_jobs_phase(phase, joining):
    assert admit(phase, joining) is ADMISSIONS[(phase, joining)]


def test_the_table_covers_every_phase_and_every_registration():
    assert set(ADMISSIONS) == {(phase, joining) for phase in JobState for joining in Joining}


@pytest.mark.parametrize(
    ("phase", "registered", "full", "starts"),
    [
        (JobState.REGISTERING, 4, 4, True),
        (JobState.REGISTERING, 3, 4, False),
        (R, 4, 4, False),  # a host back after the start: the job runs already
        (S, 4, 4, False),
    ],
)
def test_the_first_start_waits_for_every_host_of_the_full_job(phase, registered, full, starts):
    assert all_registered(phase, registered, full) is starts


PARK, DROP, CAP = Step.PARK, Step.STOP_AS_DROPPED, Step.CAPACITY_RETURNED
AGAIN, WITH_REST, LOST = Step.RECONSIDER, Step.STOP_WITH_THE_REST, Step.STOP_AS_LOST
BACK = [
    # A new machine (a replacement pod, a supervisor restarted before it had a workload).
    (R, Back(Joining.HOST, takes_part=True), Answer(None, (LOST, Step.NO_WORKLOAD, AGAIN))),
    (S, Back(Joining.HOST, takes_part=True), Answer(None, (AGAIN,))),
    (R, Back(Joining.HOST, takes_part=False), Answer(None, (CAP,))),
    (S, Back(Joining.HOST, takes_part=False), Answer(None, (AGAIN,))),
    (JobState.SUCCEEDED, Back(Joining.HOST, takes_part=True), Answer(None, ())),
    # A member rejoining a new leader.
    (R, Back(Joining.REJOINING, takes_part=True), Answer(HostState.TRAINING, ())),
    (R, Back(Joining.REJOINING, True, in_step=False), Answer(HostState.TRAINING, (LOST,))),
    (S, Back(Joining.REJOINING, takes_part=True), Answer(HostState.STOPPING, (WITH_REST,))),
    (S, Back(Joining.REJOINING, True, in_step=False), Answer(HostState.STOPPING, (WITH_REST,))),
    (R, Back(Joining.REJOINING, takes_part=False), Answer(HostState.PARKED, (DROP, PARK, CAP))),
    (R, Back(Joining.REJOINING, False, idle=True), Answer(HostState.PARKED, (DROP, PARK))),
    (S, Back(Joining.REJOINING, takes_part=False), Answer(HostState.PARKED, (DROP, PARK, AGAIN))),
    (S, Back(Joining.REJOINING, False, idle=True), Answer(HostState.PARKED, (DROP, PARK, AGAIN))),
    # A supervisor started again on its machine: its workload died with the one before.
    (R, Back(Joining.RESTARTED, takes_part=True), Answer(HostState.STOPPING, (Step.CRASH,))),
    (S, Back(Joining.RESTARTED, takes_part=True), Answer(HostState.STOPPING, (WITH_REST,))),
    (R, Back(Joining.RESTARTED, takes_part=False), Answer(HostState.PARKED, (PARK, CAP))),
    (R, Back(Joining.RESTARTED, False, idle=True), Answer(HostState.PARKED, (PARK,))),
    (S, Back(Joining.RESTARTED, takes_part=False), Answer(HostState.PARKED, (PARK, AGAIN))),
]


@pytest.mark.parametrize(("phase", "facts", "answer"), BACK)
def test_a_host_served_again_is_told_what_its_facts_and_the_phase_call_for(phase, facts, answer):
    assert back(phase, facts) == answer


def test_a_member_back_while_the_job_stops_for_no_recorded_cause_stops_for_its_own():
    assert UNKNOWN_CAUSE == {Joining.REJOINING: FaultKind.HOST_LOST, Joining.RESTARTED: FaultKind.CRASH}
