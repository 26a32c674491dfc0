"""Spares and hot-swap, the persistent tier's commits and restore sources over tiers, in the leader.

Every test drives a real Leader over TCP on 127.0.0.1 with fake members and fake spares speaking
JSON lines (tests/support/fake_members.py), and a watcher that reads the leader's events.
"""

import asyncio
from dataclasses import dataclass, field
from typing import Any

from slicekeeper.supervisor.leader import Leader, checkpoints
from slicekeeper.supervisor.leader.journal import JobState
from slicekeeper.supervisor.persistent_tier import PersistentTierError

from tests.support.fake_members import Member, coordinator, eventually, join, run


def replica_address(host: int) -> str:
    return f"10.0.1.{host}:7100"


def spare_address(spare: int) -> str:
    return f"10.0.2.{spare}:7100"


def local() -> dict[str, Any]:
    return {"tier": "local"}


def persistent() -> dict[str, Any]:
    return {"tier": "persistent"}


def peer(holder: int, address: str | None = None) -> dict[str, Any]:
    return {"tier": "peer", "holder": holder, "address": address or replica_address(holder)}


class FakePersistent:
    """Stands in for the persistent tier: records the leader's commit and retain calls; `earlier`
    is what earlier runs committed (step -> hosts whose shard it holds); `unreadable` makes listing it
    fail."""

    def __init__(
        self,
        error: Exception | None = None,
        earlier: dict[int, set[int]] | None = None,
        unreadable: Exception | None = None,
    ) -> None:
        self.calls: list[tuple[str, int]] = []
        self.error = error
        self.earlier = earlier or {}
        self.unreadable = unreadable
        self.listings = 0

    def committed_owners(self) -> dict[int, set[int]]:
        self.listings += 1
        if self.unreadable is not None:
            raise self.unreadable
        return dict(self.earlier)

    def commit(self, step: int) -> None:
        self.calls.append(("commit", step))
        if self.error is not None:
            raise self.error

    def retain(self, keep: int) -> None:
        self.calls.append(("retain", keep))


@dataclass
class Job:
    leader: Leader
    members: list[Member]
    spares: list[Member]
    watcher: Member
    events: list[str] = field(default_factory=list)

    async def event(self, fragment: str) -> str:
        """The first event (seen so far or next) whose text contains `fragment`."""
        while True:
            for text in self.events:
                if fragment in text:
                    return text
            message = await self.watcher.receive()
            if message["type"] == "event":
                self.events.append(message["text"])

    async def shut(self) -> None:
        for connection in [*self.members, *self.spares, self.watcher]:
            connection.close()
        await self.leader.close()


async def spare_registers(port: int, spare: int) -> Member:
    """A fake spare supervisor: host None until the leader assigns it one."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    member = Member(None, reader, writer)  # type: ignore[arg-type]
    await member.send(
        "register_spare",
        spare=spare,
        machine=f"spare-{spare}",
        replica_address=spare_address(spare),
        metrics_port=9200 + spare,
    )
    return member


async def leader_with_spares(
    hosts: int = 3,
    spares: int = 1,
    max_restarts: int = 3,
    persistent: FakePersistent | None = None,
    persistent_keep: int = 2,
) -> Job:
    """A leader, a watcher of its events, `spares` registered spares and unregistered members."""
    leader = Leader(
        hosts=hosts,
        max_restarts=max_restarts,
        coordinator_address=coordinator,
        persistent=persistent,  # type: ignore[arg-type]
        persistent_keep=persistent_keep,
    )
    port = await leader.serve("127.0.0.1", 0)
    [watcher] = await join(port, 1)
    await watcher.send("watch")
    assert (await watcher.receive())["type"] == "status"
    job = Job(leader, [], [], watcher)
    for spare in range(spares):
        job.spares.append(await spare_registers(port, spare))
        await job.event(f"spare {spare} (spare-{spare}) registered")
    job.members = await join(port, hosts)
    return job


async def register(member: Member) -> None:
    await member.send(
        "register",
        metrics_port=9100 + member.host,
        replica_address=replica_address(member.host),
        machine=f"host-{member.host}",
    )


async def job_with_spares(
    hosts: int = 3,
    spares: int = 1,
    max_restarts: int = 3,
    persistent: FakePersistent | None = None,
    persistent_keep: int = 2,
) -> Job:
    """Spares registered first, then every member: the `start` of generation 0 consumed."""
    job = await leader_with_spares(hosts, spares, max_restarts, persistent, persistent_keep)
    for member in job.members:
        await register(member)
    for member in job.members:
        start = await member.receive()
        assert (start["type"], start["generation"], start["restore_step"]) == ("start", 0, None)
    return job


async def nothing_arrives(member: Member, seconds: float = 0.1) -> bool:
    try:
        await asyncio.wait_for(member.reader.readline(), seconds)
    except TimeoutError:
        return True
    return False


async def lose(job: Job, host: int) -> None:
    """`host` fires the chaos fault `lose` and its supervisor's connection drops."""
    member = job.members[host]
    spec = f"lose:host={host}@step=5"
    await member.send(
        "chaos", kind="lose", step=5, t=100.0, generation=job.leader.memory.generation, fault=spec
    )
    await eventually(lambda: any(f.spec == spec for f in job.leader.memory.faults))
    member.close()


async def all_stop(members: list[Member], generation: int, kind: str) -> None:
    for member in members:
        message = await member.receive()
        message.pop("host")  # whose fault it is: checked where a test cares
        assert message == {"type": "stop", "generation": generation, "kind": kind}


async def assigned(spare: Member, host: int, generation: int, fired: list[str]) -> None:
    assert await spare.receive() == {"type": "assign", "host": host, "generation": generation, "fired": fired}
    spare.host = host


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


async def host_1_swapped_and_restarted(job: Job) -> None:
    """Two hosts: host 1 lost, spare 0 takes over and receives its `start` of generation 1."""
    await job.members[0].progress(0, step=12, t=90.0)
    await lose(job, 1)
    await all_stop(job.members[:1], generation=0, kind="host_lost")
    await assigned(job.spares[0], host=1, generation=0, fired=["lose:host=1@step=5"])
    await job.members[0].send("stopped", generation=0, committed=[10], replicas={"1": [10]})
    for member in (job.members[0], job.spares[0]):
        start = await member.receive()
        assert (start["type"], start["generation"], start["restore_step"]) == ("start", 1, 10)


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


# --- restores, persistent commits, invalid steps --------------------------------------------------


def test_restored_messages_are_recorded_in_the_summary_with_their_generation():
    async def scenario():
        job = await job_with_spares(hosts=2, spares=1)
        await host_1_swapped_and_restarted(job)
        await job.members[0].send("restored", step=10, tier="local", seconds=0.01, bytes=4096)
        await job.spares[0].send("restored", step=10, tier="peer", holder=0, seconds=0.25, bytes=4096)
        await eventually(lambda: len(job.leader.summary()["restores"]) == 2)
        restores = sorted(job.leader.summary()["restores"], key=lambda r: r["host"])
        assert restores == [
            {
                "host": 0,
                "step": 10,
                "tier": "local",
                "holder": None,
                "generation": 1,
                "seconds": 0.01,
                "bytes": 4096,
                "loaded_step": None,
            },
            {
                "host": 1,
                "step": 10,
                "tier": "peer",
                "holder": 0,
                "generation": 1,
                "seconds": 0.25,
                "bytes": 4096,
                "loaded_step": None,
            },
        ]
        # Each workload says which step it loaded: recorded next to what its supervisor staged.
        await job.members[0].send("loaded", generation=1, step=10)
        await job.spares[0].send("loaded", generation=1, step=5)
        await eventually(lambda: all(r["loaded_step"] for r in job.leader.summary()["restores"]))
        loaded = {r["host"]: r["loaded_step"] for r in job.leader.summary()["restores"]}
        assert loaded == {0: 10, 1: 5}
        await job.shut()

    run(scenario)


def test_a_persistent_step_is_committed_once_every_host_uploaded_its_shard():
    async def scenario():
        store = FakePersistent()
        job = await job_with_spares(hosts=2, spares=0, persistent=store, persistent_keep=3)
        await job.members[0].send("persisted", step=10)
        await job.members[0].send("checkpoint", step=10)  # a marker processed after it
        await eventually(lambda: 10 in job.leader.status[0].committed)
        assert store.calls == []  # host 1's shard is not uploaded yet
        await job.members[1].send("persisted", step=10)
        await eventually(lambda: len(store.calls) == 2)
        assert store.calls == [("commit", 10), ("retain", 3)]
        for member in job.members:  # a repeated report commits nothing more
            await member.send("persisted", step=10)
            await member.send("checkpoint", step=11)
        await eventually(lambda: all(11 in s.committed for s in job.leader.status.values()))
        assert store.calls == [("commit", 10), ("retain", 3)]
        assert job.leader.summary()["persistent_committed"] == [10]
        assert "persistent checkpoint of step 10 committed" in await job.event("persistent checkpoint")
        await job.shut()

    run(scenario)


def test_a_committed_persistent_step_is_offered_as_a_source_at_a_later_restart():
    async def scenario():
        store = FakePersistent()
        job = await job_with_spares(hosts=2, spares=0, persistent=store)
        for member in job.members:
            await member.send("persisted", step=10)
        await eventually(lambda: job.leader.summary()["persistent_committed"] == [10])
        await job.members[0].fault(0)
        await all_stop(job.members, generation=0, kind="crash")
        await job.members[0].send("stopped", generation=0, committed=[10])
        await job.members[1].send("stopped", generation=0, committed=[])  # its local copy is gone
        starts = [await m.receive() for m in job.members]
        assert [s["restore_step"] for s in starts] == [10, 10]
        assert [s["sources"] for s in starts] == [[local(), persistent()], [persistent()]]
        await job.shut()

    run(scenario)


def test_a_persistent_step_uploaded_by_some_hosts_only_is_never_offered():
    async def scenario():
        store = FakePersistent()
        job = await job_with_spares(hosts=2, spares=0, persistent=store)
        await job.members[0].send("persisted", step=10)
        await job.members[0].fault(0)
        await all_stop(job.members, generation=0, kind="crash")
        for member in job.members:
            await member.send("stopped", generation=0, committed=[])
        starts = [await m.receive() for m in job.members]
        assert [(s["restore_step"], s["sources"]) for s in starts] == [(None, []), (None, [])]
        assert store.calls == []
        await job.shut()

    run(scenario)


def test_a_job_whose_earlier_run_committed_persistent_steps_starts_from_the_newest_of_them():
    """A suspended job resumed, or a job re-created under the same name: generation 0 restores the
    newest committed step, every host from the persistent tier, and the job's high-water mark is it."""

    async def scenario():
        store = FakePersistent(earlier={20: {0, 1}, 40: {0, 1}, 60: {0, 1}})
        job = await leader_with_spares(hosts=2, spares=0, persistent=store, persistent_keep=2)
        for member in job.members:
            await register(member)
        starts = [await m.receive() for m in job.members]
        assert [(s["generation"], s["restore_step"], s["sources"]) for s in starts] == [
            (0, 60, [persistent()]),
            (0, 60, [persistent()]),
        ]
        summary = job.leader.summary()
        assert summary["persistent_committed"] == [40, 60]  # the newest `persistent_keep`
        assert summary["steps_completed"] == 60
        [recovery] = summary["recoveries"]
        assert (recovery["cause"], recovery["restore_step"], recovery["steps_replayed"]) == ("resume", 60, 0)
        assert "generation 0 starting from step 60 of an earlier run" in await job.event("generation 0")
        await job.shut()

    run(scenario)


def test_a_job_with_no_earlier_persistent_step_starts_from_scratch_and_records_no_restore():
    async def scenario():
        store = FakePersistent()
        job = await job_with_spares(hosts=2, spares=0, persistent=store)  # asserts restore_step None
        assert store.listings == 1
        assert job.leader.summary()["recoveries"] == []
        await job.shut()

    run(scenario)


def test_an_earlier_step_saved_by_a_scaled_down_world_gives_the_missing_hosts_their_twins_shards():
    async def scenario():
        store = FakePersistent(earlier={30: {0, 1}})  # slice 1 (hosts 2, 3) was dropped then
        leader = Leader(
            hosts=4, max_restarts=3, coordinator_address=coordinator, persistent=store, hosts_per_slice=2
        )  # type: ignore[arg-type]
        port = await leader.serve("127.0.0.1", 0)
        members = await join(port, 4)
        for member in members:
            await register(member)
        starts = [await m.receive() for m in members]
        assert [s["restore_step"] for s in starts] == [30] * 4
        assert [s["sources"] for s in starts] == [
            [persistent()],
            [persistent()],
            [{**persistent(), "owner": 0}],
            [{**persistent(), "owner": 1}],
        ]
        for member in members:
            member.close()
        await leader.close()

    run(scenario)


def test_a_persistent_tier_that_cannot_be_read_at_the_start_fails_the_job_instead_of_starting_over(
    monkeypatch,
):
    monkeypatch.setattr(checkpoints, "PERSISTENT_LISTING_BACKOFF", 0.01)

    async def scenario():
        store = FakePersistent(unreadable=PersistentTierError("gs://bucket/job: listing failed: 503"))
        job = await leader_with_spares(hosts=2, spares=0, persistent=store)
        for member in job.members:
            await register(member)
        message = await job.members[0].receive()
        assert message["type"] == "fail"
        assert "cannot read the persistent tier" in message["reason"] and "503" in message["reason"]
        assert store.listings == checkpoints.PERSISTENT_LISTING_ATTEMPTS  # tried again before giving up
        await job.shut()

    run(scenario)


def test_each_restart_records_the_holdings_the_restore_step_and_the_steps_executed_again():
    async def scenario():
        job = await job_with_spares(hosts=2, spares=0)
        for member in job.members:
            await member.progress(0, 13, t=10.0)
        await eventually(lambda: job.leader.memory.high_water == 13)
        await job.members[1].fault(0)
        await all_stop(job.members, generation=0, kind="crash")
        await job.members[0].send("stopped", generation=0, committed=[5, 10], replicas={"1": [10]})
        await job.members[1].send("stopped", generation=0, committed=[5, 10], replicas={"0": [10]})
        [await m.receive() for m in job.members]
        [recovery] = job.leader.summary()["recoveries"]
        assert recovery["generation"] == 1 and recovery["cause"] == "crash" and recovery["host"] == 1
        assert (recovery["high_water"], recovery["restore_step"], recovery["steps_replayed"]) == (13, 10, 3)
        assert recovery["held"]["local"] == {"0": [5, 10], "1": [5, 10]}
        assert recovery["held"]["replicas"] == {"0": {"1": [10]}, "1": {"0": [10]}}
        await job.shut()

    run(scenario)


def test_a_persistent_commit_that_fails_with_an_os_error_counts_as_a_failed_save_and_commits_nothing():
    async def scenario():
        store = FakePersistent(error=OSError("bucket unavailable"))
        job = await job_with_spares(hosts=2, spares=0, persistent=store)
        for member in job.members:
            await member.send("persisted", step=10)
        await eventually(lambda: bool(job.leader.memory.failed_saves))
        summary = job.leader.summary()
        assert summary["failed_saves"] == {"persistent": 1}
        assert summary["persistent_committed"] == []
        assert job.leader.memory.state is JobState.RUNNING
        assert "not committed: bucket unavailable" in await job.event("persistent checkpoint of step 10")
        await job.shut()

    run(scenario)


def test_a_persistent_commit_that_fails_in_the_persistent_tier_counts_as_a_failed_save_and_the_job_runs_on():
    async def scenario():
        store = FakePersistent(error=PersistentTierError("gs://bucket/job: commit of step 10 failed"))
        job = await job_with_spares(hosts=2, spares=0, persistent=store)
        for member in job.members:
            await member.send("persisted", step=10)
        await eventually(
            lambda: bool(job.leader.memory.failed_saves) or job.leader.memory.state is not JobState.RUNNING
        )
        assert job.leader.memory.state is JobState.RUNNING
        assert job.leader.summary()["failed_saves"] == {"persistent": 1}
        await job.shut()

    run(scenario)


def test_a_fault_naming_an_invalid_step_excludes_it_for_every_host_until_it_is_saved_again():
    async def scenario():
        store = FakePersistent()
        job = await job_with_spares(hosts=2, spares=0, persistent=store)
        for member in job.members:
            for step in (10, 20):
                await member.send("checkpoint", step=step)
            await member.send("persisted", step=20)
        await eventually(lambda: job.leader.summary()["persistent_committed"] == [20])
        await job.members[1].send(
            "fault", generation=0, kind="nonfinite_loss", detail="loss nan", t=100.0, invalid_step=20
        )
        await all_stop(job.members, generation=0, kind="nonfinite_loss")
        for member in job.members:
            await member.send("stopped", generation=0, committed=[10, 20])
        starts = [await m.receive() for m in job.members]
        assert [(s["restore_step"], s["sources"]) for s in starts] == [(10, [local()]), (10, [local()])]
        # The bad step 20 belonged to the abandoned timeline (every tier dropped it at the restore):
        # a step 20 saved again after restoring 10 is a new checkpoint, and restorable.
        await job.members[0].progress(1, step=21, t=110.0)
        await job.members[0].fault(1)
        await all_stop(job.members, generation=1, kind="crash")
        for member in job.members:
            await member.send("stopped", generation=1, committed=[10, 20])
        assert [(await m.receive())["restore_step"] for m in job.members] == [20, 20]
        await job.shut()

    run(scenario)


def test_an_invalid_step_reported_with_a_stale_generation_is_not_excluded():
    async def scenario():
        job = await job_with_spares(hosts=2, spares=0)
        await job.members[0].fault(0)
        await all_stop(job.members, generation=0, kind="crash")
        for member in job.members:
            await member.send("stopped", generation=0, committed=[10])
        for member in job.members:
            assert (await member.receive())["generation"] == 1
        await job.members[1].send(
            "fault", generation=0, kind="nonfinite_loss", detail="late", t=1.0, invalid_step=10
        )
        await job.members[1].send("checkpoint", step=10)  # a marker processed after it
        await eventually(lambda: 10 in job.leader.status[1].committed)
        assert job.leader.memory.job_invalid == set()
        await job.shut()

    run(scenario)


async def host_1_reports_step_20_invalid(job: Job, reason: str) -> list[dict[str, Any]]:
    """Both hosts save 10 and 20; host 1's local copy of 20 is reported invalid with `reason`;
    host 0 holds a replica of host 1's step 20. Returns the `start` of generation 1."""
    for member in job.members:
        for step in (10, 20):
            await member.send("checkpoint", step=step)
    await job.members[1].send("checkpoint_invalid", step=20, tier="local", reason=reason, detail="checksum")
    await eventually(
        lambda: job.leader.status[1].committed == {10} and job.leader.status[0].committed == {10, 20}
    )
    await job.members[0].fault(0)
    await all_stop(job.members, generation=0, kind="crash")
    await job.members[0].send("stopped", generation=0, replicas={"1": [10, 20]})
    await job.members[1].send("stopped", generation=0)
    return [await m.receive() for m in job.members]


def test_a_corrupt_local_copy_is_dropped_but_a_peer_replica_still_restores_that_step():
    async def scenario():
        job = await job_with_spares(hosts=2, spares=0)
        starts = await host_1_reports_step_20_invalid(job, reason="corrupt")
        assert [s["restore_step"] for s in starts] == [20, 20]
        assert [s["sources"] for s in starts] == [[local()], [peer(0)]]
        assert job.leader.summary()["failed_saves"] == {}  # a corrupt copy is no failed save
        await job.shut()

    run(scenario)


def test_a_failed_local_save_makes_that_step_unusable_for_the_host_even_with_a_peer_replica():
    async def scenario():
        job = await job_with_spares(hosts=2, spares=0)
        starts = await host_1_reports_step_20_invalid(job, reason="save failed")
        assert [s["restore_step"] for s in starts] == [10, 10]
        assert [s["sources"] for s in starts] == [[local()], [local(), peer(0)]]
        assert job.leader.summary()["failed_saves"] == {"local": 1}
        await job.shut()

    run(scenario)


def test_a_shard_no_source_could_restore_is_never_chosen_again_for_that_host():
    async def scenario():
        job = await job_with_spares(hosts=2, spares=0)
        for member in job.members:
            for step in (10, 20):
                await member.send("checkpoint", step=step)
        await job.members[1].send("checkpoint_invalid", step=20, tier="any", reason="no valid copy")
        await eventually(lambda: 20 in job.leader.status[1].invalid)
        await job.members[0].fault(0)
        await all_stop(job.members, generation=0, kind="crash")
        await job.members[0].send("stopped", generation=0, committed=[10, 20], replicas={"1": [20]})
        await job.members[1].send("stopped", generation=0, committed=[10, 20])
        assert [(await m.receive())["restore_step"] for m in job.members] == [10, 10]
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
