"""The leader turns the first fault of a generation into one restart of every host, within a budget.

Every test drives a real Leader over TCP on 127.0.0.1 with fake members speaking JSON lines
(tests/support/fake_members.py).
"""

import asyncio
import json
from typing import Any

import pytest
from slicekeeper.supervisor.leader import Leader
from slicekeeper.supervisor.leader.journal import JobState
from slicekeeper.supervisor.leader_connection import open_control_connection

from slicekeeper import protocol
from tests.support.fake_members import Member, coordinator, eventually, join, run


async def running_job(
    hosts: int = 2, max_restarts: int = 3, max_restarts_without_progress: int = 3
) -> tuple[Leader, list[Member]]:
    """A leader with every member registered and the `start` of generation 0 consumed."""
    leader = Leader(
        hosts=hosts,
        max_restarts=max_restarts,
        coordinator_address=coordinator,
        max_restarts_without_progress=max_restarts_without_progress,
    )
    port = await leader.serve("127.0.0.1", 0)
    members = await join(port, hosts)
    for member in members:
        await member.send("register", metrics_port=9100 + member.host)
    for member in members:
        start = await member.receive()
        assert (start["type"], start["generation"]) == ("start", 0)
    return leader, members


async def restart(members: list[Member], generation: int) -> list[dict[str, Any]]:
    """Fault on host 0, every member acks the stop; returns the `start` each member received."""
    await members[0].fault(generation)
    for member in members:
        assert (await member.receive())["type"] == "stop"
    for member in members:
        await member.send("stopped", generation=generation)
    return [await member.receive() for member in members]


async def killed_after_five_steps() -> tuple[Leader, list[Member]]:
    """Two hosts, five steps, host 1 killed at step 5 and the crash detected: every member stopping."""
    leader, members = await running_job(hosts=2)
    for step in (1, 2, 3, 4, 5):
        await members[0].progress(0, step=step, t=90.0 + step)
    await members[1].send("chaos", kind="kill", step=5, t=96.0, generation=0)
    await eventually(lambda: leader.memory.high_water == 5 and len(leader.memory.faults) == 1)
    await members[1].fault(0, kind="crash", t=97.5)
    for member in members:
        assert (await member.receive())["type"] == "stop"
    return leader, members


async def shut(leader: Leader, members: list[Member]) -> None:
    for member in members:
        member.close()
    await leader.close()


# --- registration ---------------------------------------------------------------------------------


def test_once_every_member_registered_each_gets_start_of_generation_0_from_scratch():
    async def scenario():
        leader = Leader(hosts=3, max_restarts=3, coordinator_address=coordinator)
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
                "world": [0, 1, 2],
                "rank": member.host,
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
def test_a_hang_is_stopped_and_decided_as_the_host_that_stopped_not_the_one_that_noticed(stopped):
    async def scenario():
        leader, members = await running_job(hosts=3)
        reporter = (stopped + 1) % 3
        await members[reporter].fault(0, kind="hang")
        await members[(stopped + 2) % 3].fault(0, kind="hang")  # the same stall, noticed again
        for member in members:  # the leader asks every host where its workload is, once
            assert await member.receive() == {"type": "activity_request", "generation": 0}
            stage = "begun" if member.host == stopped else "work_done"
            await member.send(
                "activity", generation=0, step=12, stage=stage, phase="idle", silent_seconds=2.0
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
                "world": [0, 1],
                "rank": member.host,
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
        leader = Leader(hosts=2, max_restarts=3, coordinator_address=coordinator, summary_path=summary_path)
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


# --- chaos bookkeeping ----------------------------------------------------------------------------


def test_an_injected_fault_gets_its_detection_resumption_and_productive_times():
    async def scenario():
        leader, members = await killed_after_five_steps()
        for member in members:
            await member.send("stopped", generation=0)
        for member in members:
            assert (await member.receive())["type"] == "start"
        await members[1].progress(0, step=6, t=105.0)  # a late step of the generation torn down
        await members[1].send("checkpoint", step=1)  # a marker processed after it, same connection
        await eventually(lambda: 1 in leader.status[1].committed)
        await members[0].progress(1, step=3, t=110.0)  # steps again, below the high-water mark
        await members[0].progress(1, step=5, t=112.0)
        await members[0].progress(1, step=6, t=113.0)  # beyond it: productive again
        await members[0].progress(1, step=7, t=114.0)
        await eventually(lambda: leader.status[0].step == 7)
        [fault] = leader.summary()["faults"]
        assert fault["kind"] == "kill"
        assert fault["host"] == 1
        assert fault["step"] == 5
        assert fault["fired_at"] == pytest.approx(96.0)
        assert fault["detected_at"] == pytest.approx(97.5)
        assert fault["detected_as"] == "crash"
        assert fault["high_water_at_detection"] == 5
        assert fault["resumed_at"] == pytest.approx(110.0)
        assert fault["productive_at"] == pytest.approx(113.0)
        await shut(leader, members)

    run(scenario)


def test_an_injected_fault_never_detected_keeps_its_times_empty():
    async def scenario():
        leader, members = await running_job(hosts=2)
        await members[0].send("chaos", kind="hang", step=3, t=50.0, generation=0)
        await members[0].progress(0, step=4, t=51.0)
        await eventually(lambda: leader.status[0].step == 4)
        [fault] = leader.summary()["faults"]
        assert fault["detected_at"] is None
        assert fault["resumed_at"] is None
        assert fault["productive_at"] is None
        await shut(leader, members)

    run(scenario)


def test_a_step_completed_while_the_job_is_stopping_does_not_raise_the_high_water_mark():
    async def scenario():
        leader, members = await killed_after_five_steps()
        await members[0].progress(0, step=6, t=98.0)  # finished just before its process was killed
        await members[0].send("checkpoint", step=1)  # processed after it, same connection
        await eventually(lambda: 1 in leader.status[0].committed)
        assert leader.memory.high_water == 5
        for member in members:
            await member.send("stopped", generation=0)
        for member in members:
            assert (await member.receive())["type"] == "start"
        await members[0].progress(1, step=6, t=110.0)  # executed again after the restore to step 5
        await members[0].progress(1, step=7, t=111.0)
        await eventually(lambda: leader.status[0].step == 7)
        [fault] = leader.summary()["faults"]
        assert fault["resumed_at"] == pytest.approx(110.0)
        assert fault["productive_at"] == pytest.approx(110.0)  # step 6 was never completed before
        await shut(leader, members)

    run(scenario)


def test_the_restore_step_comes_from_what_each_host_lists_on_disk_when_it_stops():
    async def scenario():
        leader, members = await running_job(hosts=2)
        for member in members:  # what the events said: both hold 10 and 20
            await member.send("checkpoint", step=10)
            await member.send("checkpoint", step=20)
        await eventually(lambda: all(leader.status[h].committed == {10, 20} for h in (0, 1)))
        await members[0].fault(0)
        for member in members:
            assert (await member.receive())["type"] == "stop"
        # retention deleted 10 and 20 on host 0 after its last report; 30 committed everywhere
        await members[0].send("stopped", generation=0, committed=[30])
        await members[1].send("stopped", generation=0, committed=[20, 30])
        starts = [await member.receive() for member in members]
        assert [s["restore_step"] for s in starts] == [30, 30]
        await shut(leader, members)

    run(scenario)


def test_a_step_reported_invalid_stays_excluded_even_if_still_listed_on_disk():
    async def scenario():
        leader, members = await running_job(hosts=2)
        await members[1].send("checkpoint_invalid", step=30)
        await eventually(lambda: 30 in leader.status[1].invalid)
        await members[0].fault(0)
        for member in members:
            assert (await member.receive())["type"] == "stop"
        await members[0].send("stopped", generation=0, committed=[20, 30])
        await members[1].send("stopped", generation=0, committed=[20, 30])
        assert [(await m.receive())["restore_step"] for m in members] == [20, 20]
        await shut(leader, members)

    run(scenario)


def test_a_fault_fired_in_an_older_generation_is_not_credited_to_a_later_detection():
    async def scenario():
        leader, members = await running_job(hosts=2)
        await members[0].send("chaos", kind="hang", step=3, t=50.0, generation=0)
        await restart(members, generation=0)  # generation 0 ended by a crash elsewhere: not the hang
        await eventually(lambda: leader.memory.generation == 1)
        [fault] = leader.summary()["faults"]
        assert fault["detected_as"] == "crash"  # detected in its own generation 0
        await members[1].send("chaos", kind="kill", step=9, t=60.0, generation=0)  # a late report
        await eventually(lambda: len(leader.memory.faults) == 2)
        await members[1].fault(1, t=61.0)
        for member in members:
            assert (await member.receive())["type"] == "stop"
        assert leader.summary()["faults"][1]["detected_at"] is None
        await shut(leader, members)

    run(scenario)


def test_a_member_that_never_acks_a_stop_fails_the_job(monkeypatch):
    from slicekeeper.supervisor.leader import generations

    monkeypatch.setattr(generations, "STOP_ACK_SECONDS", 0.2)

    async def scenario():
        leader, members = await running_job(hosts=2)
        await members[0].fault(0)
        for member in members:
            assert (await member.receive())["type"] == "stop"
        await members[0].send("stopped", generation=0)  # host 1 never answers
        message = await members[0].receive()
        assert message["type"] == "fail"
        assert "host(s) [1] did not stop their workload within" in message["reason"]
        await shut(leader, members)

    run(scenario)


# --- the journal, written down on every member ----------------------------------------------------


def test_before_each_command_the_leader_writes_its_journal_down_on_every_member():
    async def scenario():
        leader, members = await running_job(hosts=2)
        await members[1].fault(0, kind="crash")
        for member in members:
            assert (await member.receive())["type"] == "stop"
            memory = member.journals[-1]["journal"]["memory"]  # what the member held when told to stop
            assert (memory["state"], memory["restarts"]) == ("stopping", {"crash": 1})
            assert [(d["kind"], d["host"]) for d in memory["detections"]] == [("crash", 1)]
        for member in members:
            await member.send("stopped", generation=0)
        for member in members:
            assert (await member.receive())["type"] == "start"
            newest = member.journals[-1]
            assert newest["journal"]["memory"]["generation"] == 1
            decisions = newest["journal"]["remediation"]["decisions"]
            assert [(d["event"]["kind"], d["action"]["name"]) for d in decisions] == [("crash", "restart")]
            assert newest["journal"] == json.loads(json.dumps(leader.journal()))
            numbers = [journal["seq"] for journal in member.journals]
            assert numbers == sorted(set(numbers))  # each newer than the last
        await shut(leader, members)

    run(scenario)


def test_a_member_reads_a_journal_longer_than_asyncios_default_line_limit():
    async def scenario():
        line = protocol.encode({"type": "journal", "seq": 1, "journal": {"padding": "x" * (1 << 20)}})

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(line)
            await writer.drain()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await open_control_connection("127.0.0.1", port)
        assert await reader.readline() == line
        writer.close()
        plain, writer = await asyncio.open_connection("127.0.0.1", port)  # 64 KiB lines at most
        with pytest.raises(ValueError):
            await plain.readline()
        writer.close()
        server.close()

    run(scenario)


# --- the leader's process ending ------------------------------------------------------------------


def test_a_leader_standing_down_takes_its_members_leaving_for_its_own_end_not_for_hosts_lost():
    async def scenario():
        leader, members = await running_job(hosts=3)
        leader.stand_down("received SIGTERM")
        for member in members:  # every pod of the job is going (suspended, deleted)
            member.close()
        await asyncio.sleep(0.5)  # the leader reads every connection's end
        assert leader.memory.state is JobState.RUNNING and leader.memory.restarts == {}
        assert leader.memory.detections == [] and leader.decisions.records == []
        await leader.close()

    run(scenario)
