"""What the leader writes down: each injected fault's times, the high-water mark and restore step from
what the hosts list, its journal on every member, and its own ending told apart from hosts lost.

Every test drives a real Leader over TCP on 127.0.0.1 with fake members speaking JSON lines
(tests/support/fake_members.py, tests/support/leader_jobs.py).
"""

import asyncio
import copy
import json

import pytest
from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader.journal import received
from slicekeeper.supervisor.leader.restart_state import JobState
from slicekeeper.supervisor.leader_connection import open_control_connection

from slicekeeper import protocol
from tests.support.fake_members import eventually, run
from tests.support.leader_jobs import killed_after_five_steps, restart, running_job, shut

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


def holding(member) -> dict:
    """The journal `member` holds: each journal line taken as a member takes it (whole, or a change)."""
    held = None
    for line in copy.deepcopy(member.journals):  # a change is made to the journal held, in place
        held = received(held, messages.Journal.model_validate(line))
    assert held is not None
    return held.journal


def test_before_each_command_the_leader_writes_its_journal_down_on_every_replica():
    async def scenario():
        leader, members = await running_job(hosts=2)  # a job this small: every member is a replica
        await members[1].fault(0, kind="crash")
        for member in members:
            assert (await member.receive())["type"] == "stop"
            memory = holding(member)["memory"]  # what the member held when told to stop
            assert (memory["state"], memory["restarts"]) == ("stopping", {"crash": 1})
            assert [(d["kind"], d["host"]) for d in memory["detections"]] == [("crash", 1)]
        for member in members:
            await member.send("stopped", generation=0)
        for member in members:
            assert (await member.receive())["type"] == "start"
            newest = holding(member)
            assert newest["memory"]["generation"] == 1
            decisions = newest["remediation"]["decisions"]
            assert [(d["event"]["kind"], d["action"]["name"]) for d in decisions] == [("crash", "restart")]
            assert newest == json.loads(json.dumps(leader.journal()))
            numbers = [journal["seq"] for journal in member.journals]
            assert numbers == sorted(set(numbers))  # each newer than the last
            assert any(journal.get("change") is not None for journal in member.journals)  # as changes
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
