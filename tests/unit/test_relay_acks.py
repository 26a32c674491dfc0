"""A relay gathers its members' acknowledgements of a stop into one line for the leader
(supervisor.host.relay_acks), once the group's are in, without reordering any member's lines and
without holding one for a member that never answers."""

from __future__ import annotations

import asyncio

from slicekeeper.supervisor.host.relay_acks import AckGathering
from slicekeeper.supervisor.relay_frames import lines_of, parse

from slicekeeper import protocol
from tests.support.fake_members import run

STOP = protocol.encode({"term": 1, "type": "stop", "generation": 4, "kind": "crash"})


def ack(host: int, generation: int = 4) -> bytes:
    return protocol.encode({"type": "stopped", "generation": generation, "committed": [], "host": host})


class Leader:
    """What the leader is sent: each frame's (channel, line) pairs."""

    def __init__(self) -> None:
        self.frames: list[list[tuple[int, bytes]]] = []

    def send(self, data: bytes) -> None:
        self.frames.append(
            [(channel, protocol.decode(line)["host"]) for channel, line in lines_of(parse(data))]
        )


def gathering(wait: float = 1.0) -> tuple[AckGathering, Leader]:
    leader = Leader()
    acks = AckGathering(leader.send, wait)
    acks.stop_sent([0, 1, 2], STOP)
    return acks, leader


def test_the_acknowledgements_go_on_together_once_every_member_told_acknowledged():
    async def scenario() -> None:
        acks, leader = gathering()
        assert acks.held(0, ack(10)) and acks.held(2, ack(12))
        assert leader.frames == []
        assert acks.held(1, ack(11))
        assert leader.frames == [[(0, 10), (2, 12), (1, 11)]]
        acks.close()

    run(scenario)


def test_another_line_of_a_member_whose_acknowledgement_is_held_goes_after_it():
    async def scenario() -> None:
        acks, leader = gathering()
        assert acks.held(0, ack(10))
        committed = protocol.encode({"type": "committed", "step": 3, "host": 10})
        assert not acks.held(0, committed)  # the caller sends it on: the acknowledgement went first
        assert leader.frames == [[(0, 10)]]
        assert not acks.held(1, committed)  # nothing of that member held: nothing sent first
        assert leader.frames == [[(0, 10)]]
        acks.close()

    run(scenario)


def test_a_member_gone_is_not_waited_for_and_its_acknowledgement_goes_before_its_end():
    async def scenario() -> None:
        acks, leader = gathering()
        assert acks.held(0, ack(10)) and acks.held(1, ack(11))
        acks.gone(2)  # never acknowledged: the others go on now
        assert leader.frames == [[(0, 10), (1, 11)]]
        acks, leader = gathering()
        assert acks.held(0, ack(10))
        acks.gone(0)
        assert leader.frames == [[(0, 10)]]
        acks.close()

    run(scenario)


def test_a_member_that_never_answers_holds_the_others_only_until_the_wait_is_over():
    async def scenario() -> None:
        acks, leader = gathering(wait=0.05)
        assert acks.held(0, ack(10)) and acks.held(1, ack(11))
        await asyncio.sleep(0.2)
        assert leader.frames == [[(0, 10), (1, 11)]]
        assert not acks.held(2, ack(12))  # late: sent on by itself
        acks.close()

    run(scenario)


def test_an_acknowledgement_not_awaited_is_not_held():
    async def scenario() -> None:
        acks, leader = gathering()
        assert not acks.held(5, ack(15))  # a member the stop did not go to
        assert not acks.held(0, ack(10, generation=3))  # another generation's
        assert leader.frames == []
        acks.close()

    run(scenario)
