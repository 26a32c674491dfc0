"""The leader turns the first fault of a generation into one restart of every host, within a budget,
and ends the job when every host finished.

Every test drives a real Leader over TCP on 127.0.0.1 with fake members speaking JSON lines
(tests/support/fake_members.py, tests/support/leader_jobs.py).
"""

import asyncio

import pytest
from slicekeeper.supervisor.leader import Leader, generations, remediation
from slicekeeper.supervisor.leader.restart_state import JobState
from slicekeeper.supervisor.leader.settings import LeaderSettings

from slicekeeper.shape import JobShape
from tests.support.fake_members import coordinator, eventually, join, run
from tests.support.leader_jobs import restart, running_job, shut

# --- registration ---------------------------------------------------------------------------------


def test_once_every_member_registered_each_gets_start_of_generation_0_from_scratch():
    async def scenario():
        leader = Leader(LeaderSettings(JobShape(1, 3), 3), coordinator)
        port = await leader.serve("127.0.0.1", 0)
        assert port > 0
        members = await join(port, 3)
        for member in members[:2]:
            await member.send("register", metrics_port=9100 + member.host)
        await eventually(lambda: leader.status[1].state == "registered")
        assert leader.memory.state is JobState.REGISTERING
        await members[2].send("register", metrics_port=9102)
        for member in members:
            assert await member.receive() == {
                "type": "start",
                "generation": 0,
                "coordinator": "10.0.0.1:8476",
                "restore_step": None,
                "sources": [],
                "replica_addresses": {},
                "world": "0-2",  # hosts as runs on the wire (messages.Hosts)
                "rank": member.host,
                "progress_every": 1,
            }
        assert leader.memory.state is JobState.RUNNING
        assert leader.summary()["metrics_ports"] == {0: 9100, 1: 9101, 2: 9102}
        await shut(leader, members)

    run(scenario)


def test_a_watcher_gets_the_job_status():
    async def scenario():
        leader, members = await running_job(hosts=2)
        [watcher] = await join(members[0].writer.get_extra_info("peername")[1], 1)
        await watcher.send("watch")
        status = await watcher.receive()
        assert status["type"] == "status"
        assert status["state"] == "running"
        assert [h["host"] for h in status["hosts"]] == [0, 1]
        await shut(leader, [*members, watcher])

    run(scenario)


# --- one fault, one restart of every host ---------------------------------------------------------


def test_a_fault_on_one_host_stops_every_member():
    async def scenario():
        leader, members = await running_job(hosts=3)
        await members[1].fault(0, kind="crash")
        for member in members:
            assert await member.receive() == {"type": "stop", "generation": 0, "kind": "crash", "host": 1}
        assert leader.memory.state is JobState.STOPPING
        assert leader.memory.restarts == {"crash": 1}
        await shut(leader, members)

    run(scenario)


@pytest.mark.parametrize("stopped", [0, 1, 2])
def test_a_hang_is_stopped_and_decided_as_the_host_that_stopped_not_the_one_that_noticed(
    stopped, monkeypatch
):
    """The host behind is asked about again one allowance later (0.2 s here) and, still where it
    was, is the hang's culprit (tests/unit/test_hang_confirmation.py: a host that moved is not)."""
    monkeypatch.setattr(remediation, "ACTIVITY_REPLY_SECONDS", 0.2)

    async def scenario():
        leader, members = await running_job(hosts=3)
        reporter = (stopped + 1) % 3
        await members[reporter].fault(0, kind="hang")
        await members[(stopped + 2) % 3].fault(0, kind="hang")  # the same stall, noticed again
        for silent in (2.0, 3.0):  # the leader asks every host where its workload is, twice
            for member in members:
                assert await member.receive() == {"type": "activity_request", "generation": 0}
                stage = "begun" if member.host == stopped else "work_done"
                await member.send(
                    "activity", generation=0, step=12, stage=stage, phase="idle", silent_seconds=silent
                )
        for member in members:
            assert await member.receive() == {
                "type": "stop",
                "generation": 0,
                "kind": "hang",
                "host": stopped,
            }
        [detection] = leader.memory.detections
        assert detection.host == stopped
        assert f"noticed by host {reporter}; host {stopped} is in its own work of step 12" in detection.detail
        assert f"host {stopped} did not move in" in detection.detail
        await eventually(lambda: len(leader.decisions.records) == 1)
        assert leader.decisions.records[0]["event"]["host"] == stopped
        await shut(leader, members)

    run(scenario)


def test_a_hang_is_named_after_a_host_that_does_not_say_where_it_is():
    async def scenario():
        leader, members = await running_job(hosts=3)
        await members[0].fault(0, kind="hang")
        for member in members:
            assert await member.receive() == {"type": "activity_request", "generation": 0}
            if member.host != 2:  # host 2's supervisor is as stuck as its workload
                await member.send(
                    "activity", generation=0, step=5, stage="work_done", phase="idle", silent_seconds=2
                )
        for member in members:
            assert await member.receive() == {"type": "stop", "generation": 0, "kind": "hang", "host": 2}
        assert "the supervisor of host 2 did not answer" in leader.memory.detections[0].detail
        await shut(leader, members)

    run(scenario)


def test_after_every_stop_is_acked_the_job_starts_again_from_the_newest_common_checkpoint():
    async def scenario():
        leader, members = await running_job(hosts=2)
        for step in (10, 20):
            await members[0].send("checkpoint", step=step)
        await members[1].send("checkpoint", step=10)
        await eventually(
            lambda: leader.status[0].committed == {10, 20} and leader.status[1].committed == {10}
        )
        await members[0].fault(0)
        for member in members:
            assert (await member.receive())["type"] == "stop"
        await members[0].send("stopped", generation=0)
        await eventually(lambda: leader.status[0].state == "stopped")
        assert leader.memory.state is JobState.STOPPING  # host 1 has not acked yet
        await members[1].send("stopped", generation=0)
        for member in members:
            assert await member.receive() == {
                "type": "start",
                "generation": 1,
                "coordinator": "10.0.0.1:8477",
                "restore_step": 10,
                "sources": [{"tier": "local"}],
                "replica_addresses": {},
                "world": "0-1",
                "rank": member.host,
                "progress_every": 1,
            }
        assert leader.memory.generation == 1
        assert leader.memory.detections[-1].restore_step == 10
        await shut(leader, members)

    run(scenario)


def test_without_a_checkpoint_on_every_host_the_restart_is_from_scratch():
    async def scenario():
        leader, members = await running_job(hosts=2)
        await members[0].send("checkpoint", step=10)
        await eventually(lambda: leader.status[0].committed == {10})
        starts = await restart(members, generation=0)
        assert [s["restore_step"] for s in starts] == [None, None]
        await shut(leader, members)

    run(scenario)


def test_checkpoints_newer_than_the_restore_point_are_forgotten_at_the_restart():
    async def scenario():
        leader, members = await running_job(hosts=2)
        for member, steps in zip(members, [(10, 20), (10,)], strict=True):
            for step in steps:
                await member.send("checkpoint", step=step)
        await eventually(
            lambda: leader.status[0].committed == {10, 20} and leader.status[1].committed == {10}
        )
        assert [s["restore_step"] for s in await restart(members, generation=0)] == [10, 10]
        # Host 1 saves step 20 again in generation 1; host 0's old step 20 was discarded at the restore.
        await members[1].send("checkpoint", step=20)
        await eventually(lambda: leader.status[1].committed == {10, 20})
        assert [s["restore_step"] for s in await restart(members, generation=1)] == [10, 10]
        await shut(leader, members)

    run(scenario)


def test_a_step_reported_invalid_is_never_chosen_for_the_restore():
    async def scenario():
        leader, members = await running_job(hosts=2)
        for member in members:
            for step in (10, 20):
                await member.send("checkpoint", step=step)
        await members[1].send("checkpoint_invalid", step=20)
        await eventually(lambda: leader.status[1].committed == {10} and len(leader.status[0].committed) == 2)
        assert [s["restore_step"] for s in await restart(members, generation=0)] == [10, 10]
        await shut(leader, members)

    run(scenario)


def test_a_second_fault_of_the_same_generation_is_ignored():
    async def scenario():
        leader, members = await running_job(hosts=2)
        await members[0].fault(0, kind="crash")
        await eventually(lambda: leader.memory.state is JobState.STOPPING)
        await members[1].fault(0, kind="hang")  # the same stall seen from the other host
        for member in members:
            assert (await member.receive())["type"] == "stop"
        for member in members:
            await member.send("stopped", generation=0)
        for member in members:
            message = await member.receive()
            assert (message["type"], message["generation"]) == ("start", 1)
        assert sum(leader.memory.restarts.values()) == 1  # whichever of the two arrived first
        assert len(leader.memory.detections) == 1
        await shut(leader, members)

    run(scenario)


def test_a_fault_from_an_older_generation_is_ignored():
    async def scenario():
        leader, members = await running_job(hosts=2)
        await restart(members, generation=0)
        await members[1].fault(0)  # a late report about the generation already torn down
        await members[1].progress(1, step=3, t=200.0)  # processed after the fault, same connection
        await eventually(lambda: leader.status[1].step == 3)
        assert leader.memory.state is JobState.RUNNING
        assert leader.memory.generation == 1
        assert sum(leader.memory.restarts.values()) == 1
        await shut(leader, members)

    run(scenario)


def test_a_stop_ack_for_another_generation_does_not_count():
    async def scenario():
        leader, members = await running_job(hosts=2)
        await restart(members, generation=0)
        await members[0].fault(1)
        for member in members:
            assert (await member.receive())["type"] == "stop"
        await members[0].send("stopped", generation=1)
        await members[1].send("stopped", generation=0)  # stale ack
        await members[1].send("checkpoint", step=99)  # a marker processed after it, same connection
        await eventually(lambda: leader.status[0].state == "stopped" and 99 in leader.status[1].committed)
        assert leader.memory.state is JobState.STOPPING
        assert leader.status[1].state != "stopped"
        await members[1].send("stopped", generation=1)
        for member in members:
            message = await member.receive()
            assert (message["type"], message["generation"]) == ("start", 2)
        await shut(leader, members)

    run(scenario)


# --- the restart budget ---------------------------------------------------------------------------


def test_once_the_restart_budget_is_spent_the_next_fault_fails_the_job_on_every_host():
    async def scenario():
        leader, members = await running_job(hosts=2, max_restarts=1)
        await restart(members, generation=0)
        await members[1].fault(1, kind="crash")
        for member in members:
            message = await member.receive()
            assert message["type"] == "fail"
            assert "restart budget spent" in message["reason"]
            assert "1 in-job restarts" in message["reason"]
        assert leader.memory.state is JobState.FAILED
        assert leader.done.is_set()
        summary = leader.summary()
        assert summary["state"] == "failed"
        assert "budget" in summary["failure_reason"]
        assert summary["restarts"] == {"crash": 1}
        await shut(leader, members)

    run(scenario)


def test_with_no_restarts_allowed_the_first_fault_fails_the_job():
    async def scenario():
        leader, members = await running_job(hosts=2, max_restarts=0)
        await members[0].fault(0)
        for member in members:
            message = await member.receive()
            assert message["type"] == "fail"
            assert "budget" in message["reason"]
        await shut(leader, members)

    run(scenario)


def test_a_job_that_never_completes_a_step_fails_before_the_budget_is_spent():
    async def scenario():
        leader, members = await running_job(hosts=2, max_restarts=10, max_restarts_without_progress=2)
        await restart(members, generation=0)  # the first start made no progress: one strike
        await members[0].fault(1)  # nor did the second: the job fails
        for member in members:
            message = await member.receive()
            assert message["type"] == "fail"
            assert "no progress across 2 consecutive starts" in message["reason"]
        assert sum(leader.memory.restarts.values()) == 1
        await shut(leader, members)

    run(scenario)


def test_a_completed_step_resets_the_count_of_starts_without_progress():
    async def scenario():
        leader, members = await running_job(hosts=2, max_restarts=10, max_restarts_without_progress=2)
        await restart(members, generation=0)  # no progress: one strike
        await members[0].progress(1, step=1, t=10.0)  # then a step: the count starts over
        starts = await restart(members, generation=1)
        assert [s["generation"] for s in starts] == [2, 2]
        await restart(members, generation=2)  # one strike again, not two
        assert leader.memory.state is JobState.RUNNING
        await shut(leader, members)

    run(scenario)


def test_losing_a_member_with_no_spare_left_fails_the_job_with_that_reason():
    async def scenario():
        leader, members = await running_job(hosts=2)
        members[1].close()
        assert (await members[0].receive())["type"] == "stop"
        message = await members[0].receive()
        assert message["type"] == "fail"
        assert "host 1 lost: cannot replace it (no spare is available)" in message["reason"]
        assert leader.memory.state is JobState.FAILED
        await shut(leader, members[:1])

    run(scenario)


# --- the end --------------------------------------------------------------------------------------


def test_when_every_host_finished_each_gets_shutdown_and_the_job_succeeded(tmp_path):
    async def scenario():
        summary_path = tmp_path / "job-summary.json"
        leader = Leader(LeaderSettings(JobShape(1, 2), 3, summary_path=summary_path), coordinator)
        port = await leader.serve("127.0.0.1", 0)
        members = await join(port, 2)
        for member in members:
            await member.send("register", metrics_port=None)
        for member in members:
            assert (await member.receive())["type"] == "start"
        for member in members:
            await member.progress(0, step=50, t=10.0)
        await members[0].send("finished", generation=0, step=50, fingerprint="abc")
        await eventually(lambda: leader.status[0].state == "finished")
        assert leader.memory.state is JobState.RUNNING  # host 1 is still training
        await members[1].send("finished", generation=0, step=50, fingerprint="abc")
        for member in members:
            assert await member.receive() == {"type": "shutdown"}
        assert leader.done.is_set()
        summary = leader.summary()
        assert summary["state"] == "succeeded"
        assert summary["fingerprints"] == {0: "abc", 1: "abc"}
        assert summary["steps_completed"] == 50
        assert summary["generations"] == 1
        assert summary_path.exists()
        await shut(leader, members)

    run(scenario)


def test_a_finished_report_from_a_stale_generation_is_ignored():
    async def scenario():
        leader, members = await running_job(hosts=2)
        await restart(members, generation=0)
        for member in members:
            await member.send("finished", generation=0, step=50, fingerprint="old")
            await member.progress(1, step=7, t=50.0)
        await eventually(lambda: all(s.step == 7 for s in leader.status.values()))
        assert leader.memory.state is JobState.RUNNING
        assert leader.summary()["fingerprints"] == {}
        await shut(leader, members)

    run(scenario)


# --- acknowledgements taken in batches --------------------------------------------------------------


async def batches_of_acks(monkeypatch: pytest.MonkeyPatch, batch_seconds: float) -> list[int]:
    """The acknowledgements the restart machine takes at a time when 6 hosts ack a stop 30 ms apart
    (the job starts again after them either way)."""
    monkeypatch.setattr(generations, "ACK_BATCH_SECONDS", batch_seconds)
    taken: list[int] = []
    original = generations.Generations._take

    async def counted(self: generations.Generations, generation: int) -> None:
        taken.append(len(self._acks.get(generation, ())))
        await original(self, generation)

    monkeypatch.setattr(generations.Generations, "_take", counted)
    leader, members = await running_job(hosts=6)
    await members[0].fault(0)
    for member in members:
        assert (await member.receive())["type"] == "stop"
    for member in members:
        await member.send("stopped", generation=0)
        await asyncio.sleep(0.03)
    for member in members:
        assert (await member.receive())["type"] == "start"
    await shut(leader, members)
    return [count for count in taken if count]


def test_acknowledgements_are_taken_together_and_at_once_when_they_may_complete_the_world(monkeypatch):
    """Each batch costs the start condition's check, which grows with the job: acknowledgements that
    come over a while are taken together, and the last one starts the job at once (a batch that may
    complete the world does not wait: here the wait is longer than the test may take)."""

    async def scenario() -> None:
        assert await batches_of_acks(monkeypatch, batch_seconds=60.0) == [6]

    run(scenario)


def test_negative_control_acknowledgements_taken_as_they_come_are_many_batches(monkeypatch):
    async def scenario() -> None:
        assert len(await batches_of_acks(monkeypatch, batch_seconds=0.0)) > 1

    run(scenario)
