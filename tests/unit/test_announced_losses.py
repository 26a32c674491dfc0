"""A loss announced ahead (maintenance, a preemption's grace): the leader has every host save the same
step and hold, waits for it (the noticed host's shard replicated too), then lets the policy decide,
and the restart restores that step: nothing trained again. A save not done in time is the
unannounced path, said in the decision's event.

A real Leader over TCP with fake members (tests/support/leader_jobs.py): one slice of three hosts,
one spare or none.
"""

from __future__ import annotations

import time

import pytest
from slicekeeper.supervisor.leader import announced
from slicekeeper.supervisor.leader.restart_state import JobState

from tests.support.fake_members import Member, eventually, run
from tests.support.leader_jobs import Job, all_stop, assigned, job_with_spares, nothing_arrives

PACE = 0.1
"""Seconds per step the members report: the leader saves REACH_SECONDS of steps ahead, and one more."""
AHEAD = 11


async def trained_to_step_10(job: Job) -> None:
    for step in range(1, 11):
        for member in job.members:
            await member.progress(0, step=step, t=100.0 + PACE * step)
    await eventually(lambda: job.leader.memory.high_water == 10)


async def notice(member: Member, seconds: float, cause: str = "maintenance") -> None:
    await member.send("notice", cause=cause, at=time.time() + seconds, source="test", t=time.time())


async def asked_to_save(members: list[Member], step: int, noticed: int) -> None:
    for member in members:
        order = await member.receive()
        assert (order["type"], order["generation"], order["step"], order["noticed"]) == (
            "save_at",
            0,
            step,
            noticed,
        )


def decided(job: Job) -> dict:
    [decision] = job.leader.summary()["decisions"]
    return decision


def test_a_maintenance_notice_saves_the_step_in_flight_then_hands_the_host_to_a_spare():
    async def scenario():
        job = await job_with_spares(hosts=3, spares=1)
        await trained_to_step_10(job)
        await notice(job.members[1], seconds=30)
        step = 10 + AHEAD
        await asked_to_save(job.members, step, noticed=1)
        for member in job.members:
            await member.send("checkpoint", step=step)
        await job.members[1].send("replicated", step=step)
        await job.event(f"step {step} saved on every host and replicated for host 1")
        await all_stop([job.members[0], job.members[2]], generation=0, kind="announced_loss")
        assert (await job.members[1].receive())["type"] == "stop"
        assert (await job.members[1].receive())["type"] == "retire"
        await assigned(job.spares[0], host=1, generation=0, fired=[])
        await job.members[0].send("stopped", generation=0, committed=[step], replicas={"1": [step]})
        await job.members[2].send("stopped", generation=0, committed=[step], replicas={})
        start = await job.spares[0].receive()
        assert (start["type"], start["generation"], start["restore_step"]) == ("start", 1, step)
        decision = decided(job)
        assert decision["action"] == {"name": "replace", "host": 1}
        assert (decision["event"]["cause"], decision["event"]["saved_step"]) == ("maintenance", step)
        assert job.leader.memory.restarts["announced_loss"] == 1
        await job.shut()

    run(scenario)


def test_negative_control_a_shard_not_replicated_in_time_is_the_unannounced_path():
    """Every host committed the step, but the noticed host never says its shard reached its peers:
    a spare could not restore it, so no step counts as saved once the notice runs out."""

    async def scenario():
        job = await job_with_spares(hosts=3, spares=1)
        await trained_to_step_10(job)
        await notice(job.members[1], seconds=1.0)
        step = 10 + AHEAD
        await asked_to_save(job.members, step, noticed=1)
        for member in job.members:
            await member.send("checkpoint", step=step)
        await job.event("was not saved on every host before the notice ran out")
        await eventually(lambda: len(job.leader.summary()["decisions"]) == 1)
        decision = decided(job)
        assert decision["event"]["saved_step"] is None and decision["action"]["name"] == "replace"
        await job.shut()

    run(scenario)


def test_with_no_spare_and_no_slice_to_spare_the_held_job_restarts_in_place_from_the_saved_step():
    async def scenario():
        job = await job_with_spares(hosts=3, spares=0)
        await trained_to_step_10(job)
        await notice(job.members[2], seconds=30, cause="preemption")
        step = 10 + AHEAD
        await asked_to_save(job.members, step, noticed=2)
        for member in job.members:
            await member.send("checkpoint", step=step)
        await job.members[2].send("replicated", step=step)
        await all_stop(job.members, generation=0, kind="announced_loss")
        assert decided(job)["action"] == {"name": "ignore"}
        await job.event(f"held after saving step {step} on notice")
        for member in job.members:
            await member.send("stopped", generation=0, committed=[step], replicas={})
        for member in job.members:
            start = await member.receive()
            assert (start["type"], start["generation"], start["restore_step"]) == ("start", 1, step)
        assert job.leader.memory.state is JobState.RUNNING
        await job.shut()

    run(scenario)


def test_a_notice_said_twice_is_acted_on_once():
    async def scenario():
        job = await job_with_spares(hosts=3, spares=1)
        await trained_to_step_10(job)
        await notice(job.members[1], seconds=30)
        await notice(job.members[1], seconds=29)
        await asked_to_save(job.members, 10 + AHEAD, noticed=1)
        assert await nothing_arrives(job.members[0], seconds=0.3)  # no second request
        await job.shut()

    run(scenario)


@pytest.mark.parametrize(
    ("paces", "ahead"),
    [([], 2), ([0.1], 11), ([0.5, 0.1], 11), ([2.0], 2), ([0.0001], 1000)],
)
def test_the_step_saved_is_as_far_ahead_as_the_fastest_host_goes_in_the_reach_time(paces, ahead):
    assert announced.steps_ahead(paces) == ahead


def test_a_whole_slice_announced_saves_once_and_hands_every_host_over():
    """GKE interrupts a whole TPU slice for a host event on one of its VMs: the operator's notice
    reaches every host of the slice. One save for all of them, each noticed host's shard replicated,
    then one decision per host."""

    async def scenario():
        job = await job_with_spares(hosts=3, spares=2)
        await trained_to_step_10(job)
        await notice(job.members[1], seconds=30)
        step = 10 + AHEAD
        await asked_to_save(job.members, step, noticed=1)
        await notice(job.members[2], seconds=30)  # while the save is under way
        order = await job.members[2].receive()
        assert (order["type"], order["step"], order["noticed"]) == ("save_at", step, 2)  # the same step
        for member in job.members:
            await member.send("checkpoint", step=step)
        await job.members[1].send("replicated", step=step)
        assert await nothing_arrives(job.members[0], seconds=0.3)  # host 2's shard is not at its peers yet
        await job.members[2].send("replicated", step=step)
        await eventually(lambda: len(job.leader.summary()["decisions"]) == 2)
        decisions = job.leader.summary()["decisions"]
        # Both saves end at the same moment: which host's decision comes first is not set.
        assert sorted(
            (d["event"]["host"], d["event"]["saved_step"], d["action"]["name"]) for d in decisions
        ) == [
            (1, step, "replace"),
            (2, step, "replace"),
        ]
        assert job.leader.memory.restarts["announced_loss"] == 1  # one stop for both
        await job.shut()

    run(scenario)
