"""Spares and hot-swap in the leader: a spare at registration, a host lost while running, a spare lost
in its turn, idle spares at the end.

Every test drives a real Leader over TCP on 127.0.0.1 with fake members and fake spares speaking
JSON lines (tests/support/fake_members.py, tests/support/leader_jobs.py).
"""

import asyncio

from slicekeeper.supervisor.leader.capacity import declared_spares
from slicekeeper.supervisor.leader.restart_state import JobState

from tests.support.fake_members import coordinator, eventually, run
from tests.support.leader_jobs import (
    FakePersistent,
    Job,
    all_stop,
    assigned,
    host_1_swapped_and_restarted,
    job_with_spares,
    leader_with_spares,
    local,
    lose,
    nothing_arrives,
    peer,
    persistent,
    register,
    replica_address,
    spare_address,
    spare_registers,
)

# --- spares at registration -----------------------------------------------------------------------


def test_a_registered_spare_is_not_needed_for_the_job_to_start():
    async def scenario():
        job = await job_with_spares(hosts=2, spares=1)  # started once the two hosts registered
        assert job.leader.memory.state is JobState.RUNNING
        assert await nothing_arrives(job.spares[0])  # the spare stays idle: no assign, no start
        assert job.leader.summary()["hot_swaps"] == []
        assert job.leader.summary()["machines"] == {0: "host-0", 1: "host-1"}
        await job.shut()

    run(scenario)


def test_a_spare_does_not_count_as_one_of_the_hosts_the_job_waits_for():
    async def scenario():
        job = await leader_with_spares(hosts=2, spares=1)
        await register(job.members[0])
        await eventually(lambda: job.leader.status[0].state == "registered")
        assert job.leader.memory.state is JobState.REGISTERING
        assert await nothing_arrives(job.members[0])
        assert await nothing_arrives(job.spares[0])
        await job.shut()

    run(scenario)


def test_a_member_lost_before_every_host_registered_is_replaced_and_the_job_starts_with_the_spare():
    async def scenario():
        job = await leader_with_spares(hosts=3, spares=1)
        members, spare = job.members, job.spares[0]
        for member in members[:2]:
            await register(member)
        await eventually(lambda: job.leader.status[1].state == "registered")
        members[1].close()
        await assigned(spare, host=1, generation=0, fired=[])
        assert job.leader.memory.state is JobState.REGISTERING  # host 2 has not registered yet
        await register(members[2])
        for member in (members[0], spare, members[2]):
            start = await member.receive()
            assert (start["type"], start["generation"], start["restore_step"]) == ("start", 0, None)
            assert start["replica_addresses"] == {
                "0": replica_address(0),
                "1": spare_address(0),
                "2": replica_address(2),
            }
        assert job.leader.memory.restarts == {}
        assert job.leader.summary()["machines"] == {0: "host-0", 1: "spare-0", 2: "host-2"}
        await job.shut()

    run(scenario)


def test_a_member_lost_before_the_start_waits_for_a_declared_spare_that_registers_late():
    """The spares' processes start after the hosts': a host lost before every host registered is
    not the job's end while a declared spare has yet to register."""

    async def scenario():
        job = await leader_with_spares(hosts=3, spares=0, replacements=declared_spares(1, wait=30.0))
        members = job.members
        for member in members[:2]:
            await register(member)
        await eventually(lambda: job.leader.status[1].state == "registered")
        members[1].close()
        await job.event("host 1 lost before the job started: awaiting a declared spare (up to 30 s)")
        await register(members[2])
        await eventually(lambda: job.leader.status[2].state == "registered")
        assert job.leader.memory.state is JobState.REGISTERING
        spare = await spare_registers(job.port, 0)
        job.spares.append(spare)
        await assigned(spare, host=1, generation=0, fired=[])
        for member in (members[0], spare, members[2]):
            start = await member.receive()
            assert (start["type"], start.get("generation"), start.get("restore_step")) == (
                "start",
                0,
                None,
            ), start
        assert job.leader.summary()["machines"] == {0: "host-0", 1: "spare-0", 2: "host-2"}
        await job.shut()

    run(scenario)


def test_a_member_lost_before_the_start_fails_the_job_when_no_declared_spare_comes_in_time():
    async def scenario():
        job = await leader_with_spares(hosts=2, spares=0, replacements=declared_spares(1, wait=0.3))
        await register(job.members[1])
        await eventually(lambda: job.leader.status[1].state == "registered")
        job.members[1].close()
        await job.event("host 1 lost before the job started: awaiting a declared spare")
        await register(job.members[0])
        failed = await job.members[0].receive()
        assert failed["type"] == "fail"
        assert failed["reason"] == (
            "host 1 was lost before the job started and none of the 1 declared spare(s) registered "
            "within 0.3 s (spec.health.startupTimeoutSeconds)"
        )
        assert job.leader.memory.state is JobState.FAILED
        await job.shut()

    run(scenario)


def test_a_member_lost_before_the_start_with_no_spare_declared_fails_the_job_at_once():
    async def scenario():
        job = await leader_with_spares(hosts=2, spares=0)
        await register(job.members[1])
        await eventually(lambda: job.leader.status[1].state == "registered")
        job.members[1].close()
        await eventually(lambda: job.leader.memory.state is JobState.FAILED)
        assert (
            job.leader.memory.failure_reason == "host 1 was lost before the job started and no spare is left"
        )
        await job.shut()

    run(scenario)


# --- a host lost while running --------------------------------------------------------------------


async def host_2_lost(job: Job) -> None:
    """Hosts 0..2 reach step 20; hosts 1 and 2 fire corrupt, then host 2 fires lose: its machine is gone."""
    for member in job.members:
        await member.progress(0, step=20, t=90.0)
    await job.members[1].send(
        "chaos", kind="corrupt", step=4, t=95.0, generation=0, fault="corrupt:host=1@step=4", disruptive=False
    )
    await job.members[2].send(
        "chaos", kind="corrupt", step=4, t=95.0, generation=0, fault="corrupt:host=2@step=4", disruptive=False
    )
    await lose(job, 2)


def test_a_member_lost_while_running_stops_every_survivor_and_a_spare_is_assigned_its_identity():
    async def scenario():
        job = await job_with_spares(hosts=3, spares=1)
        await host_2_lost(job)
        await all_stop(job.members[:2], generation=0, kind="host_lost")
        # the spare learns which faults host 2 already fired, so that it never fires them again
        await assigned(
            job.spares[0], host=2, generation=0, fired=["corrupt:host=2@step=4", "lose:host=2@step=5"]
        )
        summary = job.leader.summary()
        assert summary["hot_swaps"] == [{"host": 2, "spare": 0, "machine": "spare-0", "generation": 0}]
        assert summary["restarts"] == {"host_lost": 1}
        assert summary["machines"][2] == "spare-0"
        assert summary["metrics_ports"][2] == 9200
        assert [d["kind"] for d in summary["detections"]] == ["host_lost"]
        lose_fault = next(f for f in summary["faults"] if f["kind"] == "lose")
        assert lose_fault["detected_as"] == "host_lost"
        assert "spare 0 (spare-0) takes over host 2" in await job.event("hot-swap")
        await job.shut()

    run(scenario)


def test_after_the_survivors_stop_each_host_restores_locally_and_the_swapped_host_from_a_peer():
    async def scenario():
        job = await job_with_spares(hosts=3, spares=1)
        await host_2_lost(job)
        await all_stop(job.members[:2], generation=0, kind="host_lost")
        await assigned(
            job.spares[0], host=2, generation=0, fired=["corrupt:host=2@step=4", "lose:host=2@step=5"]
        )
        assert job.leader.memory.state is JobState.STOPPING  # the survivors have not acked yet
        await job.members[0].send("stopped", generation=0, committed=[10, 20], replicas={"2": [10, 20]})
        await job.members[1].send("stopped", generation=0, committed=[10, 20], replicas={"0": [20]})
        starts = [await m.receive() for m in (job.members[0], job.members[1], job.spares[0])]
        addresses = {"0": replica_address(0), "1": replica_address(1), "2": spare_address(0)}
        for start in starts:
            assert (start["type"], start["generation"], start["restore_step"]) == ("start", 1, 20)
            assert start["coordinator"] == coordinator(1)
            assert start["replica_addresses"] == addresses
        assert [s["sources"] for s in starts] == [
            [local(), peer(1)],  # host 0: its own copy first, then host 1's replica
            [local()],
            [peer(0)],  # the swapped host: host 0 holds its shard
        ]
        assert job.leader.memory.state is JobState.RUNNING
        await job.shut()

    run(scenario)


def test_a_host_lost_while_the_job_is_stopping_is_replaced_without_its_ack():
    async def scenario():
        job = await job_with_spares(hosts=3, spares=1)
        for member in job.members:
            await member.send("checkpoint", step=10)
        await eventually(lambda: all(s.committed == {10} for s in job.leader.status.values()))
        await job.members[1].fault(0, kind="crash")
        await all_stop(job.members, generation=0, kind="crash")
        await job.members[0].send("stopped", generation=0, replicas={"2": [10]})
        await job.members[1].send("stopped", generation=0)
        await eventually(lambda: job.leader.status[1].state == "stopped")
        job.members[2].close()  # gone before it acked
        await assigned(job.spares[0], host=2, generation=0, fired=[])
        starts = [await m.receive() for m in (job.members[0], job.members[1], job.spares[0])]
        assert [(s["generation"], s["restore_step"]) for s in starts] == [(1, 10)] * 3
        assert starts[2]["sources"] == [peer(0)]
        assert job.leader.memory.restarts == {"crash": 1}  # the loss during the stop is no second restart
        await job.shut()

    run(scenario)


def test_a_swapped_host_with_no_replica_left_restores_from_the_persistent_tier():
    async def scenario():
        store = FakePersistent()
        job = await job_with_spares(hosts=3, spares=1, persistent=store)
        for member in job.members:
            await member.send("checkpoint", step=10)
            await member.send("persisted", step=10)
        await eventually(lambda: job.leader.summary()["persistent_committed"] == [10])
        await lose(job, 2)
        await all_stop(job.members[:2], generation=0, kind="host_lost")
        await assigned(job.spares[0], host=2, generation=0, fired=["lose:host=2@step=5"])
        for member in job.members[:2]:
            await member.send("stopped", generation=0, committed=[10], replicas={})
        starts = [await m.receive() for m in (job.members[0], job.members[1], job.spares[0])]
        assert [s["restore_step"] for s in starts] == [10, 10, 10]
        assert [s["sources"] for s in starts] == [
            [local(), persistent()],
            [local(), persistent()],
            [persistent()],
        ]
        await job.shut()

    run(scenario)


def test_a_host_lost_once_the_restart_budget_is_spent_fails_the_job_and_no_spare_is_assigned():
    async def scenario():
        job = await job_with_spares(hosts=2, spares=1, max_restarts=0)
        await lose(job, 1)
        message = await job.members[0].receive()
        assert message["type"] == "fail"
        assert "restart budget spent" in message["reason"]
        assert await job.spares[0].receive() == {"type": "shutdown"}  # not `assign`
        assert job.leader.summary()["hot_swaps"] == []
        await job.shut()

    run(scenario)


# --- a spare lost in its turn ---------------------------------------------------------------------


def test_a_spare_lost_during_its_own_restore_is_replaced_by_the_next_spare():
    async def scenario():
        job = await job_with_spares(hosts=2, spares=2)
        await host_1_swapped_and_restarted(job)
        job.spares[0].close()  # dies while restoring host 1's shard, before any step
        await all_stop(job.members[:1], generation=1, kind="host_lost")
        await assigned(job.spares[1], host=1, generation=1, fired=["lose:host=1@step=5"])
        await job.members[0].send("stopped", generation=1, committed=[10], replicas={"1": [10]})
        starts = [await m.receive() for m in (job.members[0], job.spares[1])]
        assert [(s["generation"], s["restore_step"]) for s in starts] == [(2, 10), (2, 10)]
        assert starts[1]["sources"] == [peer(0)]
        assert starts[1]["replica_addresses"] == {"0": replica_address(0), "1": spare_address(1)}
        assert [(s["host"], s["spare"], s["machine"]) for s in job.leader.summary()["hot_swaps"]] == [
            (1, 0, "spare-0"),
            (1, 1, "spare-1"),
        ]
        assert job.leader.memory.restarts == {"host_lost": 2}
        await job.shut()

    run(scenario)


def test_a_spare_lost_during_its_own_restore_with_no_spare_left_fails_the_job_with_that_reason():
    async def scenario():
        job = await job_with_spares(hosts=2, spares=1)
        await host_1_swapped_and_restarted(job)
        job.spares[0].close()
        await all_stop(job.members[:1], generation=1, kind="host_lost")
        message = await job.members[0].receive()
        assert message["type"] == "fail"
        assert "host 1 lost: cannot replace it (no spare is available)" in message["reason"]
        summary = job.leader.summary()
        assert summary["state"] == "failed"
        assert "host 1 lost: cannot replace it (no spare is available)" in summary["failure_reason"]
        assert len(summary["hot_swaps"]) == 1
        await job.shut()

    run(scenario)


def test_an_idle_spare_whose_connection_drops_leaves_the_pool():
    async def scenario():
        job = await job_with_spares(hosts=2, spares=1)
        job.spares[0].close()
        await job.event("spare 0 (spare-0) lost while idle")
        assert job.leader.memory.state is JobState.RUNNING  # an idle spare is no host: nothing stops
        job.members[1].close()  # now a host is lost: no spare is left to take over
        await all_stop(job.members[:1], generation=0, kind="host_lost")
        message = await job.members[0].receive()
        assert message["type"] == "fail"
        assert "host 1 lost: cannot replace it (no spare is available)" in message["reason"]
        assert job.leader.summary()["hot_swaps"] == []
        await job.shut()

    run(scenario)


# --- the end --------------------------------------------------------------------------------------


def test_at_success_idle_spares_are_told_to_shut_down():
    async def scenario():
        job = await job_with_spares(hosts=2, spares=2)
        for member in job.members:
            await member.progress(0, step=50, t=10.0)
            await member.send("finished", generation=0, step=50, fingerprint="abc")
        for connection in [*job.members, *job.spares]:
            assert await connection.receive() == {"type": "shutdown"}
        assert job.leader.summary()["state"] == "succeeded"
        # The spares end with the job: that is no loss, and the last events do not say otherwise.
        for spare in job.spares:
            spare.close()
        await job.event("training finished on every host")
        await asyncio.sleep(0.2)
        while not job.watcher.reader.at_eof():
            try:
                message = await asyncio.wait_for(job.watcher.receive(), 0.5)
            except TimeoutError:
                break
            if message["type"] == "event":
                job.events.append(message["text"])
        assert not [text for text in job.events if "lost while idle" in text], job.events
        await job.shut()

    run(scenario)


def test_when_the_job_fails_idle_spares_are_told_to_shut_down():
    async def scenario():
        job = await job_with_spares(hosts=2, spares=1, max_restarts=0)
        await job.members[0].fault(0)
        for member in job.members:
            assert (await member.receive())["type"] == "fail"
        assert await job.spares[0].receive() == {"type": "shutdown"}
        await job.shut()

    run(scenario)


def test_a_spare_that_took_over_a_host_is_told_to_shut_down_once_like_any_member():
    async def scenario():
        job = await job_with_spares(hosts=2, spares=1)
        await host_1_swapped_and_restarted(job)
        for member in (job.members[0], job.spares[0]):
            await member.progress(1, step=50, t=20.0)
            await member.send("finished", generation=1, step=50, fingerprint="abc")
        assert await job.members[0].receive() == {"type": "shutdown"}
        assert await job.spares[0].receive() == {"type": "shutdown"}
        assert await nothing_arrives(job.spares[0])  # not a second time as a spare
        assert job.leader.summary()["fingerprints"] == {0: "abc", 1: "abc"}
        await job.shut()

    run(scenario)
