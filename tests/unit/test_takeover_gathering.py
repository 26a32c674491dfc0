"""How long a leader taking over gathers its members before it acts: past `SECONDS` while members
are still arriving (at scale, on a busy machine, the last of thousands reconnecting arrive after it:
cut short, they were taken for lost and their slices dropped: seen in CI with 200 simulated hosts),
never past `LONGEST_SECONDS`, and not a moment past `SECONDS` once nobody arrives."""

from __future__ import annotations

import pytest
from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader import Leader, takeover
from slicekeeper.supervisor.leader.election import Holder
from slicekeeper.supervisor.leader.settings import LeaderSettings

from slicekeeper.shape import JobShape
from tests.support.fake_members import coordinator


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(takeover.time, "monotonic", fake)
    return fake


def gathering_on_host_1(shape: JobShape) -> takeover.Takeover:
    """Host 1's leader taking over from host 0's, nobody back yet."""
    leader = Leader(LeaderSettings(shape, 3), coordinator, term=2)

    async def nothing(*_: object) -> None:
        return None

    return takeover.Takeover(
        Holder("host-0", 0, "10.0.0.1:1"),
        Holder("host-1", 1, "10.0.0.2:1"),
        None,
        0.0,
        context=leader.context,
        carry_on=lambda _: None,
        handle=nothing,
        host_lost=nothing,
        restart=leader.generations.send,
    )


def arrives(gathering: takeover.Takeover, host: int) -> None:
    gathering.gather(messages.Register(host=host, machine=f"host-{host}"), None)  # type: ignore[arg-type]


def test_members_still_arriving_after_the_first_seconds_are_waited_for(clock):
    gathering = gathering_on_host_1(JobShape(4, 8))  # 32 hosts; host 0 (the old leader's) never back
    arrives(gathering, 1)
    for host in range(2, 31):  # host 31 never comes back either
        clock.now = 0.25 * host  # the last at 7.5 s, each 0.25 s after the one before
        arrives(gathering, host)
        assert not gathering.settled(), f"settled at {clock.now} s with members still arriving"
    clock.now = 7.5 + 0.9
    assert not gathering.settled()
    clock.now = 7.5 + takeover.ARRIVING_SECONDS
    assert gathering.settled()  # host 31 is taken for lost a second after the last arrival


def test_negative_control_nobody_arriving_settles_at_seconds(clock):
    gathering = gathering_on_host_1(JobShape(4, 8))
    arrives(gathering, 1)
    clock.now = takeover.SECONDS - 0.1
    assert not gathering.settled()
    clock.now = takeover.SECONDS
    assert gathering.settled()


def test_arrivals_without_end_are_cut_at_the_longest(clock):
    gathering = gathering_on_host_1(JobShape(4, 8))
    arrives(gathering, 1)
    host = 2
    while clock.now < takeover.LONGEST_SECONDS - 0.5:
        clock.now += 0.5
        arrives(gathering, 2 + host % 20)  # the same few again and again (a member reconnecting in a loop)
        host += 1
        assert not gathering.settled()
    clock.now = takeover.LONGEST_SECONDS
    arrives(gathering, 2)
    assert gathering.settled()


def test_every_host_back_but_the_old_leaders_settles_after_a_quiet_moment(clock):
    gathering = gathering_on_host_1(JobShape(1, 4))
    for host in (1, 2, 3):
        arrives(gathering, host)
    clock.now = takeover.QUIET_SECONDS - 0.1
    assert not gathering.settled()
    clock.now = takeover.QUIET_SECONDS
    assert gathering.settled()
