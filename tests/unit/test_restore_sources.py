"""Where a restart restores from, in the leader: restores recorded, the persistent tier's commits, and
steps reported invalid kept out of every restore.

Every test drives a real Leader over TCP on 127.0.0.1 with fake members speaking JSON lines
(tests/support/fake_members.py, tests/support/leader_jobs.py).
"""

from typing import Any

from slicekeeper.supervisor.checkpoints import store_calls
from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTierError
from slicekeeper.supervisor.leader import Leader
from slicekeeper.supervisor.leader.restart_state import JobState
from slicekeeper.supervisor.leader.settings import LeaderSettings

from slicekeeper.shape import JobShape
from tests.support.fake_members import coordinator, eventually, join, run
from tests.support.leader_jobs import (
    FakePersistent,
    Job,
    all_stop,
    host_1_swapped_and_restarted,
    job_with_spares,
    leader_with_spares,
    local,
    peer,
    persistent,
    register,
)

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
        leader = Leader(LeaderSettings(JobShape(2, 2), 3), coordinator, persistent=store)  # type: ignore[arg-type]
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
    monkeypatch.setattr(store_calls, "BACKOFF_SECONDS", 0.01)

    async def scenario():
        store = FakePersistent(unreadable=PersistentTierError("gs://bucket/job: listing failed: 503"))
        job = await leader_with_spares(hosts=2, spares=0, persistent=store)
        for member in job.members:
            await register(member)
        message = await job.members[0].receive()
        assert message["type"] == "fail"
        assert "cannot read the persistent tier" in message["reason"] and "503" in message["reason"]
        assert store.listings == store.attempts  # tried again before giving up
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
