"""The leader's background work (supervisor.leader.background): a failure ends the job with the
reason instead of leaving it stopped for ever, and a timer of a leader that lost its lease writes
nothing. A real Leader over TCP with fake members."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader import Leader, remediation
from slicekeeper.supervisor.leader.background import Task
from slicekeeper.supervisor.leader.capacity import pod_replacements
from slicekeeper.supervisor.leader.restart_state import JobState
from slicekeeper.supervisor.leader.settings import LeaderSettings

from slicekeeper.shape import JobShape
from tests.support.fake_members import Member, coordinator, eventually, join, run
from tests.support.leader_jobs import nothing_arrives, running_job, shut


async def _drained(member: Member) -> list[bytes]:
    """Whatever the leader sent `member` and it has not read yet."""
    lines: list[bytes] = []
    while len(lines) < 100 and not await nothing_arrives(member, 0.1):
        lines.append(b"a line")
    return lines


def _broken(*args: object, **kwargs: object) -> None:
    raise RuntimeError("the decision path broke")


async def _stopped_by_a_crash(members: list[Member]) -> None:
    await members[1].fault(0, kind="crash")
    for member in members:
        assert (await member.receive())["type"] == "stop"
    for member in members:
        await member.send("stopped", generation=0)


def test_a_decision_that_raises_fails_the_job_with_the_reason(monkeypatch):
    async def scenario():
        leader, members = await running_job(hosts=2)
        monkeypatch.setattr(leader.decisions, "decide", _broken)
        await _stopped_by_a_crash(members)
        for member in members:
            message = await member.receive()
            assert message["type"] == "fail"
            assert "deciding on crash on host 1" in message["reason"]
            assert "RuntimeError('the decision path broke')" in message["reason"]
        assert leader.memory.state is JobState.FAILED
        assert +leader.task_failures == {Task.DECISION: 1}
        await shut(leader, members)

    run(scenario)


def test_a_decision_on_a_hang_that_raises_fails_the_job_instead_of_leaving_it_stopped(monkeypatch):
    """A hang is decided on in the background (its culprit is named from the members' answers
    first): the decision's failure is the job's outcome too."""

    async def scenario():
        leader, members = await running_job(hosts=2)
        monkeypatch.setattr(leader.decisions, "decide", _broken)
        await members[0].fault(0, kind="hang")
        for member in members:
            assert (await member.receive())["type"] == "activity_request"
            await member.send(
                "activity", generation=0, step=3, stage="step", phase="step", silent_seconds=1.0
            )
        for member in members:
            assert (await member.receive())["type"] == "stop"
            await member.send("stopped", generation=0)
        for member in members:
            message = await member.receive()
            assert message["type"] == "fail"
            assert "deciding on hang" in message["reason"]
        assert leader.memory.state is JobState.FAILED
        assert +leader.task_failures == {Task.DECISION: 1}
        await shut(leader, members)

    run(scenario)


def test_a_background_task_that_raises_fails_the_job_with_the_reason(monkeypatch):
    """Naming a hang's culprit runs in the background (its answers come over the members'
    connections): its failure is the job's too."""
    monkeypatch.setattr(remediation, "name_culprit", _broken)

    async def scenario():
        leader, members = await running_job(hosts=2)
        await members[0].fault(0, kind="hang")
        for member in members:
            message = await member.receive()
            while message["type"] == "activity_request":
                await member.send(
                    "activity", generation=0, step=3, stage="step", phase="step", silent_seconds=1.0
                )
                message = await member.receive()
            assert message["type"] == "fail"
            assert "naming a hang's culprit" in message["reason"]
        assert +leader.task_failures == {Task.HANG_CULPRIT: 1}
        await shut(leader, members)

    run(scenario)


def test_an_ack_deadline_that_passes_while_the_leader_is_fenced_does_nothing(monkeypatch):
    from slicekeeper.supervisor.leader import generations

    monkeypatch.setattr(generations, "STOP_ACK_SECONDS", 0.2)
    leads = [True]

    async def scenario():
        leader = Leader(LeaderSettings(JobShape(1, 2), 3), coordinator, leading=lambda: leads[0])
        port = await leader.serve("127.0.0.1", 0)
        members = await join(port, 2)
        for member in members:
            await member.send("register", metrics_port=9100 + member.host)
        for member in members:
            assert (await member.receive())["type"] == "start"
        await members[0].fault(0)
        for member in members:
            assert (await member.receive())["type"] == "stop"
        await eventually(lambda: len(leader.decisions.records) == 1)  # a restart, written down
        await _drained(members[0])
        leads[0] = False  # paused past its lease: another leader may act now
        await asyncio.sleep(0.5)  # the deadline passed while fenced (host 1 never acked)
        assert leader.memory.state is JobState.STOPPING
        assert await _drained(members[0]) == []  # no journal, no `fail`
        await shut(leader, members)

    run(scenario)


def test_a_replacement_timeout_that_passes_while_the_leader_is_fenced_decides_nothing(tmp_path: Path):
    leads = [True]
    events = tmp_path / "policy-events.jsonl"

    async def scenario():
        leader = Leader(
            LeaderSettings(JobShape(2, 2), 10, events_path=events),
            coordinator,
            replacements=pod_replacements(0.3),
            leading=lambda: leads[0],
        )
        port = await leader.serve("127.0.0.1", 0)
        members = await join(port, 4)
        for member in members:
            await member.send(
                "register", replica_address=f"pod-{member.host}:1", machine=f"node-{member.host}"
            )
        for member in members:
            assert (await member.receive())["type"] == "start"
        members[3].close()
        for member in members[:3]:
            assert (await member.receive())["type"] == "stop"
        await eventually(lambda: leader.status[3].state == "awaiting replacement")
        decided = events.read_text().splitlines()
        leads[0] = False  # paused past its lease while the replacement pod is awaited
        await asyncio.sleep(0.6)
        assert events.read_text().splitlines() == decided  # no decision logged by the timer
        assert len(leader.decisions.records) == len(decided)
        assert leader.memory.state is JobState.STOPPING
        await shut(leader, members)

    run(scenario)


def test_a_leader_ending_while_hosts_are_being_lost_ends_quietly(monkeypatch):
    """A leader process ending (its pod deleted, the job over) while the losses of hosts it just
    heard of wait their turn: their connection handlers are cancelled inside their `finally`.
    Python 3.11's stream server then reported each one as an "Exception in callback" with a
    traceback: at a 10,000-host benchmark's end, 9,991 of them, 230,000 lines of log."""
    entered = asyncio.Event()

    async def waiting_its_turn(self: remediation.Remediation, host: int, machine: str) -> None:
        entered.set()
        await asyncio.Event().wait()  # the turn of the decisions, never given

    monkeypatch.setattr(remediation.Remediation, "host_lost", waiting_its_turn)
    reported: list[str] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, context: reported.append(context["message"])
        )
        leader, members = await running_job(hosts=2)
        members[1].close()
        await asyncio.wait_for(entered.wait(), 5)
        handlers = [t for t in asyncio.all_tasks() if t.get_coro().__name__ == "_connection"]  # type: ignore[union-attr]
        assert len(handlers) == 2
        for task in handlers:  # as asyncio.run's teardown does
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await asyncio.sleep(0)  # the tasks' done callbacks
        await leader.close()
        members[0].close()

    run(scenario)
    assert reported == []


async def _raises() -> None:
    raise RuntimeError("the background work broke")


@pytest.mark.parametrize("task", [task for task in Task if task is not Task.OUTCOME], ids=str)
def test_every_background_task_that_raises_fails_the_job_with_its_words(task: Task):
    """Whatever background work fails, the job fails naming it: none is left without words (a task
    without them once raised inside the outcome, which was only logged, and the job waited on)."""

    async def scenario():
        leader, members = await running_job(hosts=2)
        leader.background.spawn(task, _raises())
        for member in members:
            message = await member.receive()
            assert message["type"] == "fail"
            assert f"({task.description})" in message["reason"]
            assert "the background work broke" in message["reason"]
        assert leader.memory.state is JobState.FAILED
        assert +leader.task_failures == {task: 1}
        await shut(leader, members)

    run(scenario)


def test_the_outcome_that_raises_is_counted_and_the_job_goes_on():
    """Turning a failure into the job's outcome has no outcome of its own to turn to: counted, logged."""

    async def scenario():
        leader, members = await running_job(hosts=2)
        leader.background.spawn(Task.OUTCOME, _raises())
        await eventually(lambda: leader.task_failures[Task.OUTCOME] == 1)
        assert leader.memory.state is JobState.RUNNING
        await shut(leader, members)

    run(scenario)


def test_a_notice_whose_save_raises_fails_the_job_with_the_reason(monkeypatch):
    """Acting on a notice of an announced loss runs in the background: its failure is the job's."""

    async def scenario():
        leader, members = await running_job(hosts=2)
        monkeypatch.setattr(leader.dispatch.announced, "_save", _broken_async)
        await members[1].send("notice", cause="maintenance", at=time.time() + 30.0, source="test")
        for member in members:
            message = await member.receive()
            while message["type"] == "event":
                message = await member.receive()
            assert message["type"] == "fail"
            assert "acting on a notice of an announced loss" in message["reason"]
        assert +leader.task_failures == {Task.NOTICE: 1}
        await shut(leader, members)

    run(scenario)


async def _broken_async(*args: object, **kwargs: object) -> None:
    raise RuntimeError("the save on notice broke")


def test_a_leader_unsure_once_of_its_lease_stands_down_for_good():
    """Its lease renewed late for a moment (its event loop seconds late), a leader refused to send a
    start, then, renewed again, went on as if it had: every member waited for a start that never
    came (the control-plane benchmark at 25,000 hosts). Unsure once, it acts no more: it stands down
    and its candidate gives the lease up for the next leader."""
    leads = [True]

    async def scenario():
        leader = Leader(LeaderSettings(JobShape(1, 2), 3), coordinator, leading=lambda: leads[0])
        assert leader.leading() and not leader.standing_down
        leads[0] = False  # a renewal late: a command refused now
        await leader.members.broadcast(messages.ActivityRequest(generation=0))
        leads[0] = True  # renewed again
        assert not leader.leading() and leader.standing_down
        await leader.close()

    run(scenario)


def test_negative_control_a_leader_sure_again_would_act_again(monkeypatch):
    from slicekeeper.supervisor.leader import fence

    monkeypatch.setattr(fence.Fence, "__call__", lambda self: self._leading())  # not latched
    leads = [True]

    async def scenario():
        leader = Leader(LeaderSettings(JobShape(1, 2), 3), coordinator, leading=lambda: leads[0])
        leads[0] = False
        await leader.members.broadcast(messages.ActivityRequest(generation=0))
        leads[0] = True
        assert leader.leading() and not leader.standing_down
        await leader.close()

    run(scenario)
