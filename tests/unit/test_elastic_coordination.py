"""The leader carries out the policy: scale down by whole slices, back up, replace stragglers.

A real Leader over TCP with fake members (tests/support/fake_members.py): two slices
of two hosts, the default escalation ladder unless a test loads a user policy file.
"""

import asyncio
import json
import textwrap
import time
from pathlib import Path
from typing import Any

from slicekeeper.supervisor.leader import Leader
from slicekeeper.supervisor.leader.restart_state import JobState
from slicekeeper.supervisor.leader.settings import LeaderSettings

from slicekeeper.policy.engine import PolicyEngine, load_policy
from slicekeeper.shape import JobShape
from tests.support.fake_members import Member, coordinator, eventually, join, run


class Job:
    def __init__(self, leader: Leader, members: list[Member], port: int) -> None:
        self.leader, self.members, self.port = leader, members, port
        self.spares: list[Member] = []

    async def spare(self, index: int, **fields: Any) -> Member:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        spare = Member(-1, reader, writer)
        await spare.send(
            "register_spare", spare=index, machine=f"spare-{index}", replica_address=f"s{index}:1", **fields
        )
        await eventually(
            lambda: (
                any(s.spare == index for s in self.leader.capacity.spares)
                or any(status.machine == f"spare-{index}" for status in self.leader.status.values())
            )
        )
        self.spares.append(spare)
        return spare

    async def shut(self) -> None:
        for member in [*self.members, *self.spares]:
            member.close()
        await self.leader.close()


async def two_slices(engine: PolicyEngine | None = None, min_slices: int = 1, spares: int = 0) -> Job:
    leader = Leader(LeaderSettings(JobShape(2, 2, 2), 10, min_slices=min_slices), coordinator, engine=engine)
    port = await leader.serve("127.0.0.1", 0)
    job = Job(leader, [], port)
    for index in range(spares):
        await job.spare(index)
    job.members = await join(port, 4)
    for member in job.members:
        await member.send("register", metrics_port=9100 + member.host, replica_address=f"h{member.host}:1")
    for member in job.members:
        assert (await member.receive())["type"] == "start"
    return job


async def trained_to_step_10(job: Job) -> None:
    for member in job.members:
        await member.progress(0, step=10, t=100.0)
        await member.send("checkpoint", step=10)
    await eventually(lambda: all(s.committed == {10} for s in job.leader.status.values()))


async def host_3_lost_and_slice_1_dropped(job: Job) -> None:
    await trained_to_step_10(job)
    job.members[3].close()
    for member in job.members[:3]:
        assert (await member.receive())["type"] == "stop"
    for member in job.members[:3]:
        await member.send("stopped", generation=0, committed=[10])


def test_a_host_lost_with_no_spare_drops_its_slice_and_the_others_start_on_the_smaller_world():
    async def scenario():
        job = await two_slices()
        await host_3_lost_and_slice_1_dropped(job)
        starts = [await m.receive() for m in job.members[:2]]
        for rank, start in enumerate(starts):
            assert (start["type"], start["generation"], start["restore_step"]) == ("start", 1, 10)
            assert (start["world"], start["rank"]) == ("0-1", rank)
        assert await job.members[2].receive() == {"type": "park", "generation": 1, "restore_step": 10}
        summary = job.leader.summary()
        [decision] = summary["decisions"]
        assert (decision["event"]["kind"], decision["action"]["name"], decision["source"]) == (
            "host_lost",
            "scale_down",
            "default",
        )
        [down] = summary["scale_events"]
        assert (down["kind"], down["from_hosts"], down["to_hosts"], down["to_slices"]) == ("down", 4, 2, [0])
        assert [w["hosts"] for w in summary["world"]] == [4, 2]
        await job.shut()

    run(scenario)


def test_a_scaled_down_job_finishes_when_the_hosts_still_taking_part_finish():
    async def scenario():
        job = await two_slices()
        await host_3_lost_and_slice_1_dropped(job)
        for member in job.members[:3]:
            await member.receive()
        for member in job.members[:2]:
            await member.send("finished", generation=1, step=40, fingerprint="f")
        for member in job.members[:3]:  # the parked host is told to shut down too
            assert (await member.receive())["type"] == "shutdown"
        assert job.leader.memory.state is JobState.SUCCEEDED
        await job.shut()

    run(scenario)


def test_at_the_spec_minimum_a_lost_host_with_no_spare_fails_the_job_saying_why():
    async def scenario():
        job = await two_slices(min_slices=2)
        await trained_to_step_10(job)
        job.members[3].close()
        for member in job.members[:3]:
            assert (await member.receive())["type"] == "stop"
        message = await job.members[0].receive()
        assert message["type"] == "fail"
        assert "already at spec.minSlices=2" in message["reason"]
        await job.shut()

    run(scenario)


def test_a_spare_joining_a_scaled_down_job_brings_the_slice_back_with_twins_as_sources():
    async def scenario():
        job = await two_slices()
        await host_3_lost_and_slice_1_dropped(job)
        for member in job.members[:3]:
            await member.receive()  # start, start, park
        for member in job.members[:2]:
            await member.progress(1, step=20, t=110.0)
            await member.send("checkpoint", step=20)
        await eventually(lambda: job.leader.status[1].committed == {10, 20})
        spare = await job.spare(0, chaos="spare:+1@step=20")
        for member in job.members[:2]:
            assert (await member.receive())["type"] == "stop"
        assert (await spare.receive())["type"] == "assign"
        for member in job.members[:2]:
            await member.send("stopped", generation=1, committed=[10, 20])
        starts = [await m.receive() for m in (*job.members[:3], spare)]
        for rank, start in enumerate(starts):
            assert (start["type"], start["generation"], start["restore_step"]) == ("start", 2, 20)
            assert (start["world"], start["rank"]) == ("0-3", rank)
        # host 2 and the spare (now host 3) never saw step 20: each takes its twin's copy in slice 0
        assert starts[2]["sources"] == [{"tier": "peer", "holder": 0, "address": "h0:1", "owner": 0}]
        assert starts[3]["sources"] == [{"tier": "peer", "holder": 1, "address": "h1:1", "owner": 1}]
        summary = job.leader.summary()
        assert [e["kind"] for e in summary["scale_events"]] == ["down", "up"]
        assert summary["decisions"][-1]["action"]["name"] == "scale_up"
        assert [w["hosts"] for w in summary["world"]] == [4, 2, 4]
        assert any(f["kind"] == "spare" and f["spec"] == "spare:+1@step=20" for f in summary["faults"])
        await job.shut()

    run(scenario)


def test_a_user_policy_that_forbids_hot_swap_scales_down_although_a_spare_waits(tmp_path: Path):
    async def scenario():
        policy = tmp_path / "no_swap.py"
        policy.write_text(
            textwrap.dedent(
                """
                from slicekeeper.policy import ScaleDown

                def on_host_lost(event, context):
                    return ScaleDown()
                """
            )
        )
        job = await two_slices(engine=PolicyEngine(load_policy(policy)), spares=1)
        await host_3_lost_and_slice_1_dropped(job)
        assert (await job.members[2].receive())["type"] == "park"
        [decision] = job.leader.summary()["decisions"]
        assert (decision["action"]["name"], decision["source"]) == ("scale_down", "user")
        assert len(job.leader.capacity.spares) == 1  # the spare was not used
        await job.shut()

    run(scenario)


async def host_1_straggles(job: Job) -> None:
    """Even hosts until step 20 (every host's baseline), then host 1's own work triples."""
    for step in range(1, 45):
        for member in job.members:
            work = 0.3 if member.host == 1 and step > 20 else 0.1
            await member.send("progress", generation=0, step=step, loss=1.0, t=100.0 + step, work=work)


def test_a_straggler_with_a_spare_is_replaced_and_its_machine_retired():
    async def scenario():
        job = await two_slices(spares=1)
        await host_1_straggles(job)
        for member in job.members:
            assert (await member.receive())["type"] == "stop"
        assert (await job.members[1].receive())["type"] == "retire"
        assert (await job.spares[0].receive())["type"] == "assign"
        summary = job.leader.summary()
        [straggler] = summary["stragglers"]
        assert straggler["host"] == 1 and straggler["score"] > 2.5
        assert summary["decisions"][0]["action"] == {"name": "replace", "host": 1}
        await job.shut()

    run(scenario)


def test_a_straggler_with_no_spare_is_reported_and_the_job_runs_on():
    async def scenario():
        job = await two_slices()
        await host_1_straggles(job)
        await eventually(lambda: len(job.leader.summary()["decisions"]) == 1)
        summary = job.leader.summary()
        assert [s["host"] for s in summary["stragglers"]] == [1]
        assert summary["decisions"][0]["action"]["name"] == "ignore"
        assert job.leader.memory.state is JobState.RUNNING
        await job.shut()

    run(scenario)


async def core_0_slows_down(job: Job, *, cores: bool) -> None:
    """Local mode's hosts on 2 cores (host h on core h mod 2); from step 20 on core 0 runs 3 times
    slower: hosts 0 and 2 alike. `cores`: whether the hosts' progress names the core."""
    for step in range(1, 45):
        for member in job.members:
            work = 0.3 if member.host % 2 == 0 and step > 20 else 0.1
            core = {"core": member.host % 2} if cores else {}
            await member.send(
                "progress", generation=0, step=step, loss=1.0, t=100.0 + step, work=work, **core
            )
    await eventually(lambda: all(job.leader.status[host].step == 44 for host in range(4)))


def test_a_slowed_core_is_no_straggler_when_the_hosts_name_their_cores():
    async def scenario():
        job = await two_slices()
        await core_0_slows_down(job, cores=True)
        assert job.leader.summary()["stragglers"] == []
        await job.shut()

    run(scenario)


def test_negative_control_a_slowed_core_is_taken_for_stragglers_when_the_cores_are_not_named():
    async def scenario():
        job = await two_slices()
        await core_0_slows_down(job, cores=False)
        assert {s["host"] for s in job.leader.summary()["stragglers"]} == {0, 2}
        await job.shut()

    run(scenario)


def test_a_healthy_job_with_even_hosts_reports_no_straggler():
    async def scenario():
        job = await two_slices(spares=1)
        for step in range(1, 40):
            for member in job.members:
                work = 0.1 + 0.01 * ((step * (member.host + 3)) % 5)
                await member.send("progress", generation=0, step=step, loss=1.0, t=100.0 + step, work=work)
        await eventually(lambda: job.leader.status[3].step == 39)
        assert job.leader.summary()["stragglers"] == []
        await job.shut()

    run(scenario)


# --- a leader taking over -------------------------------------------------------------------------


def test_a_leader_taking_over_from_the_journal_carries_on_the_policys_history_budgets_and_stragglers():
    async def scenario():
        job = await two_slices()
        await host_3_lost_and_slice_1_dropped(job)
        await eventually(
            lambda: job.leader.memory.generation == 1 and job.leader.memory.state is JobState.RUNNING
        )
        await host_1_straggles_again(job)
        await eventually(lambda: len(job.leader.summary()["decisions"]) == 2)
        written = json.loads(json.dumps(job.leader.journal()))  # what a successor would receive
        successor = Leader(LeaderSettings(JobShape(2, 2, 2), 10), coordinator)
        successor.carry_on(written)
        assert successor.journal() == written
        engine, before = successor.decisions.engine, job.leader.decisions.engine
        assert engine.history == before.history and [d.action.name for d in engine.history] == [
            "scale_down",
            "ignore",
        ]
        now = time.time()
        assert engine.ledger.budgets(now) == before.ledger.budgets(now)
        # The windows are not written down (every command would cost a line per host): the hosts
        # found straggling are, and are not found again; the scores start afresh.
        assert successor.decisions.detector.flagged == {1} and successor.decisions.detector.scores() == {}
        assert successor.world.active == [0]
        for key in ("state", "generations", "restarts", "faults", "detections", "recoveries", "world"):
            assert successor.summary()[key] == job.leader.summary()[key], key
        for key in ("decisions", "stragglers", "scale_events"):
            assert successor.summary()[key] == job.leader.summary()[key], key
        await job.shut()

    run(scenario)


async def host_1_straggles_again(job: Job) -> None:
    """Generation 1 on hosts 0 and 1: even until step 30, then host 1's own work triples."""
    for step in range(11, 55):
        for member in job.members[:2]:
            work = 0.3 if member.host == 1 and step > 30 else 0.1
            await member.send("progress", generation=1, step=step, loss=1.0, t=200.0 + step, work=work)
