"""One vocabulary for the job's shape: the layout, the leader's world and the policy's view agree."""

import pytest
from slicekeeper.supervisor.leader.world import JobWorld

from slicekeeper.policy import World
from slicekeeper.shape import JobLayout, JobShape


def test_host_h_is_worker_h_mod_hosts_per_slice_of_slice_h_div_hosts_per_slice():
    shape = JobShape(slices=3, hosts_per_slice=4, devices_per_host=2)
    assert shape.host_count == 12
    assert [shape.slice_of(h) for h in (0, 3, 4, 11)] == [0, 0, 1, 2]
    assert [shape.worker_of(h) for h in (0, 3, 4, 11)] == [0, 3, 0, 3]
    assert shape.hosts_of(1) == (4, 5, 6, 7)
    assert shape.hosts_in([2, 0]) == (8, 9, 10, 11, 0, 1, 2, 3)
    assert shape.twins(5, [0, 1, 2]) == (1, 9)


@pytest.mark.parametrize("active", [(0, 1, 2), (0, 2), (1,)])
def test_the_layout_the_world_and_the_policy_view_say_the_same_of_every_host(active):
    shape = JobShape(3, 2, 4)
    layout = JobLayout("job", JobShape(3, 2, 4))
    world = JobWorld(shape, min_slices=1, active=list(active))
    view = world.for_policy(idle=set(), spares=0)
    assert layout.shape == shape == view.shape
    assert world.hosts == view.hosts == shape.hosts_in(active)
    for host in range(shape.host_count):
        assert layout.host(host).slice == world.slice_of(host) == view.slice_of(host) == shape.slice_of(host)


def test_a_shape_without_slices_hosts_or_devices_is_refused():
    with pytest.raises(ValueError, match="at least one slice"):
        JobShape(0, 2)
    assert World(
        active_slices=(1, 0), full_slices=2, min_slices=1, hosts_per_slice=2, devices_per_host=1
    ).hosts == (
        0,
        1,
        2,
        3,
    )
