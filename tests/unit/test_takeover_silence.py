"""A leader elected that hears no other machine while it gathers decides nothing: it is cut off from
the others, or a machine left over after the job ended took the lease (seen with a partitioned host
whose replacement had finished the job: it took over with a stale journal and failed the job)."""

from __future__ import annotations

from slicekeeper.supervisor.leader import Leader, takeover
from slicekeeper.supervisor.leader.election import Holder
from slicekeeper.supervisor.leader.settings import LeaderSettings

from slicekeeper.shape import JobShape
from tests.support.fake_members import coordinator, eventually, run


async def elected_in_place_of_host_0(shape: JobShape, own_host: int) -> Leader:
    """A leader of term 2 on `own_host`, taking over from host 0's, with no member back yet."""
    leader = Leader(LeaderSettings(shape, 3), coordinator, term=2)
    port = await leader.serve("127.0.0.1", 0, own_host=own_host)
    own = Holder(f"host-{own_host}", own_host, f"127.0.0.1:{port}")
    leader.take_over(Holder("host-0", 0, "10.0.0.1:1"), own, None, 100.0)
    return leader


def test_a_leader_that_hears_no_other_machine_stands_down_without_deciding(monkeypatch):
    monkeypatch.setattr(takeover, "SECONDS", 0.3)

    async def scenario():
        new = await elected_in_place_of_host_0(JobShape(2, 2), own_host=2)
        await eventually(lambda: new.standing_down)
        assert new.silence.cut_off and new.memory.leader_changes == [] and new.memory.detections == []
        await new.close()

    run(scenario)


def test_negative_control_the_last_host_of_two_carries_on_alone(monkeypatch):
    """Host 1 of a two-host job, elected when host 0 was lost, expects nobody else: it carries on."""
    monkeypatch.setattr(takeover, "SECONDS", 0.3)

    async def scenario():
        new = await elected_in_place_of_host_0(JobShape(1, 2), own_host=1)
        await eventually(lambda: new._takeover is None)
        assert not new.standing_down and not new.silence.cut_off
        await new.close()

    run(scenario)
