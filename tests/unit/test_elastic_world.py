"""The job's world: which slices take part, ranks, twins, and what a scale-up can bring back."""

import pytest
from slicekeeper.supervisor.checkpoint_vocabulary import Tier
from slicekeeper.supervisor.checkpoints.restore_plan import Holdings, Source, plan_restore
from slicekeeper.supervisor.leader.world import JobWorld

from slicekeeper.shape import JobShape


def world(slices: int = 2, per_slice: int = 2, minimum: int = 1) -> JobWorld:
    return JobWorld(JobShape(slices, per_slice, devices_per_host=2), minimum)


def test_a_full_world_holds_every_host_in_rank_order():
    full = world(3, 2)
    assert full.hosts == (0, 1, 2, 3, 4, 5)
    assert [full.rank(h) for h in full.hosts] == [0, 1, 2, 3, 4, 5]
    assert not full.scaled_down


def test_dropping_a_slice_renumbers_the_ranks_but_never_the_host_identities():
    elastic = world(3, 2)
    elastic.drop([1])
    assert elastic.hosts == (0, 1, 4, 5)
    assert elastic.rank(4) == 2
    assert elastic.dropped == [1]
    assert elastic.scaled_down


def test_a_scale_down_below_the_minimum_slices_is_refused_and_changes_nothing():
    elastic = world(2, 2, minimum=2)
    with pytest.raises(ValueError, match="minSlices=2"):
        elastic.drop([1])
    assert elastic.active == [0, 1]


def test_twins_are_the_same_worker_in_the_other_active_slices():
    elastic = world(3, 2)
    assert elastic.twins(3) == (1, 5)
    elastic.drop([2])
    assert elastic.twins(3) == (1,)


def test_a_dropped_slice_is_restorable_when_its_idle_hosts_and_the_spares_cover_every_host():
    elastic = world(3, 2)
    elastic.drop([1, 2])
    assert elastic.restorable(idle={2}, spares=0) == []
    assert elastic.restorable(idle={2}, spares=1) == [1]
    assert elastic.restorable(idle={2, 4}, spares=2) == [1, 2]
    assert elastic.restorable(idle=set(), spares=3) == [1]


def test_the_policy_sees_the_world_with_its_restorable_slices_and_mesh():
    elastic = world(2, 2)
    elastic.drop([1])
    seen = elastic.for_policy(idle={2}, spares=1)
    assert seen.active_slices == (0,)
    assert seen.restorable_slices == 1
    assert seen.idle_hosts == (2,)
    assert seen.mesh == {"replica": 1, "fsdp": 2, "model": 2}


def test_the_world_history_records_each_change_once():
    elastic = world(2, 2)
    elastic.record(step=0, generation=0)
    elastic.record(step=10, generation=1)
    elastic.drop([1])
    elastic.record(step=40, generation=2)
    assert [(w["generation"], w["hosts"]) for w in elastic.history] == [(0, 4), (2, 2)]


# --- restoring a rejoining host from its twin -------------------------------------------------------


def holdings(local: dict[int, set[int]], persistent: set[int] = frozenset(), owners=None) -> Holdings:
    return Holdings(
        local=local,
        replicas={},
        persistent=set(persistent),
        invalid={},
        job_invalid=set(),
        persistent_owners=owners or {},
    )


def test_a_rejoining_host_without_the_step_takes_its_twins_local_copy_through_the_twins_supervisor():
    held = holdings({0: {30, 40}, 1: {30, 40}, 2: {10}, 3: set()})
    plan = plan_restore([0, 1, 2, 3], held, live=[0, 1, 2, 3], twins={2: [0], 3: [1]})
    assert plan.step == 40
    assert plan.sources[0] == (Source(Tier.LOCAL),)
    assert plan.sources[2] == (Source(Tier.PEER, holder=0, owner=0),)
    assert plan.sources[3] == (Source(Tier.PEER, holder=1, owner=1),)


def test_without_twins_a_host_missing_the_step_holds_the_job_back_to_an_older_step():
    held = holdings({0: {30, 40}, 1: {30, 40}, 2: {30}, 3: {30}})
    assert plan_restore([0, 1, 2, 3], held, live=[0, 1, 2, 3]).step == 30


def test_a_rejoining_host_prefers_its_own_copy_over_its_twins():
    held = holdings({0: {40}, 2: {40}})
    plan = plan_restore([0, 2], held, live=[0, 2], twins={2: [0]})
    assert plan.sources[2] == (Source(Tier.LOCAL), Source(Tier.PEER, holder=0, owner=0))


def test_a_persistent_step_of_a_smaller_world_serves_a_rejoining_host_through_its_twins_shard():
    held = holdings({}, persistent={50}, owners={50: {0, 1}})
    plan = plan_restore([0, 1, 2, 3], held, live=[], twins={2: [0], 3: [1]})
    assert plan.step == 50
    assert plan.sources[2] == (Source(Tier.PERSISTENT, owner=0),)
    assert plan.sources[1] == (Source(Tier.PERSISTENT),)


def test_a_twin_message_names_the_owner_so_the_holder_serves_the_right_shard():
    message = Source(Tier.PEER, holder=0, owner=0).to_message({0: "127.0.0.1:9000"})
    assert message == {"tier": "peer", "holder": 0, "address": "127.0.0.1:9000", "owner": 0}
