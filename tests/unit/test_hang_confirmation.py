"""A hang is confirmed before every host is restarted unless a host is halted (supervisor/signals/culprit.py,
supervisor/leader/remediation.py).

Every host waiting in the same step is what a collective hung as a whole looks like, and also what a
job only slower than its hang allowance looks like (the first steps of a wide world, measured at 16
hosts: every host waiting for the others in step 2). The leader asks every member again one allowance
later, and restarts the job only if none went on. A host furthest behind the others (in its own
work while they wait for it) is what a hang in its work looks like, and also what a host starved of
CPU looks like: it is asked about again, and the job restarts only if it did not move. A host whose
workload is stopped or gone is restarted for at once. A real Leader over TCP with fake members.
"""

from __future__ import annotations

import pytest
from slicekeeper.supervisor.leader import remediation
from slicekeeper.supervisor.leader.restart_state import JobState
from slicekeeper.supervisor.signals import culprit
from slicekeeper.supervisor.signals.culprit import Activity, Stage

from tests.support.fake_members import Member, eventually, join, run
from tests.support.leader_jobs import nothing_arrives, running_job, shut


def at(step: int, stage: Stage, silent: float) -> Activity:
    return Activity(step, stage, "idle", silent)


@pytest.mark.parametrize(
    ("after", "went_on"),
    [
        (at(2, Stage.WORK_DONE, 4.1), False),  # the same silence, 2 s longer
        (at(2, Stage.WORK_DONE, 1.5), True),  # silent for less than it would be: it said something
        (at(2, Stage.ENDED, 0.1), True),
        (at(3, Stage.BEGUN, 0.3), True),
        (None, False),  # no answer: not known to have moved
    ],
    ids=["still", "an-event", "ended", "next-step", "no-answer"],
)
def test_a_host_went_on_when_it_got_further_or_said_anything(after, went_on):
    before = {0: at(2, Stage.WORK_DONE, 2.1), 1: at(2, Stage.WORK_DONE, 2.0)}
    assert culprit.moved(before, {0: after, 1: at(2, Stage.WORK_DONE, 4.0)}, elapsed=2.0) == (
        [0] if went_on else []
    )


async def _answer(members: list[Member], step: int, stage: str, silent: float) -> None:
    for member in members:
        assert await member.receive() == {"type": "activity_request", "generation": 0}
        await member.send(
            "activity", generation=0, step=step, stage=stage, phase="idle", silent_seconds=silent
        )


async def _hang_where_every_host_waits(members: list[Member]) -> None:
    """Host 1's timer fires in step 2, where every host waits for the others (0.3 s: the test's
    allowance); the leader asks where each workload is."""
    await members[1].send(
        "fault", generation=0, kind="hang", detail="no progress", silent_seconds=0.3, t=100.0
    )
    await _answer(members, step=2, stage="work_done", silent=0.3)


def test_a_hang_where_no_host_stands_out_is_no_restart_when_the_hosts_went_on(monkeypatch):
    monkeypatch.setattr(remediation, "ACTIVITY_REPLY_SECONDS", 0.2)

    async def scenario():
        leader, members = await running_job(hosts=3)
        [watcher] = await join(members[0].writer.get_extra_info("peername")[1], 1)
        await watcher.send("watch")
        await _hang_where_every_host_waits(members)
        await _answer(members, step=3, stage="begun", silent=0.05)  # asked again: they went on
        for member in members:
            assert await nothing_arrives(member, 0.3)  # no stop
        assert leader.memory.state is JobState.RUNNING
        assert leader.memory.restarts == {} and leader.memory.detections == []
        events = []
        while not any("not confirmed" in text for text in events):
            message = await watcher.receive()
            if message["type"] == "event":
                events.append(message["text"])
        assert "hang reported by host 1 not confirmed: host(s) 0, 1, 2 went on" in events[-1]
        assert "every host is waiting for the other hosts in step 2" in events[-1]
        await shut(leader, [*members, watcher])

    run(scenario)


def test_a_hang_where_no_host_stands_out_restarts_the_job_once_no_host_went_on(monkeypatch):
    monkeypatch.setattr(remediation, "ACTIVITY_REPLY_SECONDS", 0.2)

    async def scenario():
        leader, members = await running_job(hosts=3)
        await _hang_where_every_host_waits(members)
        await _answer(members, step=2, stage="work_done", silent=5.0)  # asked again: still there
        for member in members:
            assert await member.receive() == {"type": "stop", "generation": 0, "kind": "hang", "host": 1}
        [detection] = leader.memory.detections
        assert "no host stands out" in detection.detail and "no host went on in" in detection.detail
        await shut(leader, members)

    run(scenario)


@pytest.mark.parametrize("process", ["gone", "stopped"])
def test_a_host_whose_workload_is_halted_restarts_the_job_at_once(process, monkeypatch):
    """Host 2's workload is stopped (SIGSTOP) or gone in its own work of step 7 when host 1's hang
    timer fires: the job stops at once (no second asking) for host 2. Gone, its supervisor had not
    reaped it yet (a zombie: the supervisor held up on a loaded machine): a crash of host 2, as its
    supervisor would have said; stopped, a hang."""
    monkeypatch.setattr(remediation, "HANG_CONFIRM_MAX_SECONDS", 60.0)

    async def scenario():
        leader, members = await running_job(hosts=3)
        await members[1].send(
            "fault", generation=0, kind="hang", detail="no progress", silent_seconds=2, t=100.0
        )
        for member in members:
            assert await member.receive() == {"type": "activity_request", "generation": 0}
            stage, state = ("begun", process) if member.host == 2 else ("work_done", "running")
            await member.send(
                "activity", generation=0, step=7, stage=stage, phase="idle", silent_seconds=2.0, process=state
            )
        kind = "crash" if process == "gone" else "hang"
        for member in members:
            assert await member.receive() == {"type": "stop", "generation": 0, "kind": kind, "host": 2}
        await eventually(lambda: len(leader.memory.detections) == 1)
        await shut(leader, members)

    run(scenario)


async def _answer_each(members: list[Member], stages: dict[int, tuple[str, float]]) -> None:
    """Every member answers the leader's question with its (stage, silence) in step 7."""
    for member in members:
        assert await member.receive() == {"type": "activity_request", "generation": 0}
        stage, silent = stages[member.host]
        await member.send("activity", generation=0, step=7, stage=stage, phase="idle", silent_seconds=silent)


@pytest.mark.parametrize(
    ("host_2_then", "the_others_then", "restarted"),
    [
        (("begun", 2.5), ("work_done", 2.5), True),  # nobody moved: a hang in host 2's own work
        (("begun", 2.5), ("work_done", 0.1), True),  # the others said something, host 2 did not
        (("work_done", 0.1), ("work_done", 2.5), False),  # host 2 finished its work: only starved
        (("begun", 0.1), ("work_done", 2.5), False),  # host 2 said something: it is alive
    ],
    ids=["nobody-moved", "others-spoke", "culprit-finished-its-work", "culprit-spoke"],
)
def test_a_host_named_for_being_behind_restarts_the_job_only_if_it_did_not_move(
    host_2_then, the_others_then, restarted, monkeypatch
):
    """Host 2 is in its own work of step 7 while the others wait for it when host 1's hang timer
    fires (2 s silent, the floor). That is a hang inside host 2's work, and also a host starved of
    CPU on a loaded machine (seen in the suite's JAX runs). The leader asks again one allowance later
    and restarts the job only if host 2 did not move; what the others did meanwhile does not count.
    On the leader that named a host behind at once, the two last cases stop the job."""
    monkeypatch.setattr(remediation, "ACTIVITY_REPLY_SECONDS", 0.2)

    async def scenario():
        leader, members = await running_job(hosts=3)
        [watcher] = await join(members[0].writer.get_extra_info("peername")[1], 1)
        await watcher.send("watch")
        await members[1].send(
            "fault", generation=0, kind="hang", detail="no progress", silent_seconds=0.3, t=100.0
        )
        await _answer_each(members, {0: ("work_done", 2.0), 1: ("work_done", 2.0), 2: ("begun", 2.05)})
        await _answer_each(members, {0: the_others_then, 1: the_others_then, 2: host_2_then})
        if restarted:
            for member in members:
                assert await member.receive() == {"type": "stop", "generation": 0, "kind": "hang", "host": 2}
            [detection] = leader.memory.detections
            assert "host 2 is in its own work of step 7" in detection.detail
            assert "host 2 did not move in" in detection.detail
        else:
            for member in members:
                assert await nothing_arrives(member, 0.3)  # no stop
            assert leader.memory.state is JobState.RUNNING and leader.memory.detections == []
            events: list[str] = []
            while not any("not confirmed" in text for text in events):
                message = await watcher.receive()
                if message["type"] == "event":
                    events.append(message["text"])
            assert "hang reported by host 1 not confirmed: host(s) 2 went on" in events[-1]
        await shut(leader, [*members, watcher])

    run(scenario)
