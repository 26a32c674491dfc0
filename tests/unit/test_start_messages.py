"""A generation's start, made once for the whole world: what every host's start shares, and each
host's own (supervisor.leader.starts). Whole again, each is the start that host is meant to get: its
rank its place in the world, its own restore sources, the hosts that keep its replicas, the world
and the coordinator as every other host has them."""

from __future__ import annotations

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoint_vocabulary import Tier
from slicekeeper.supervisor.checkpoints.restore_plan import RestorePlan, Source
from slicekeeper.supervisor.leader.starts import StartMessages

from slicekeeper import protocol
from slicekeeper.shape import JobShape

WORLD = [0, 1, 2, 3, 5, 6, 7]
"""Two slices of four hosts, host 4 left out (a scale-down)."""
ADDRESSES = {host: f"10.0.0.{host}:9000" for host in range(8)}


def starts(peer_replicas: int | None = 1) -> dict[int, messages.Start]:
    plan = RestorePlan(12, {5: (Source(Tier.PEER, holder=1, owner=4), Source(Tier.PERSISTENT))})
    made = StartMessages(JobShape(2, 4), lambda generation, rank0: f"h{rank0}:{generation}", peer_replicas)
    built = made.for_world(3, WORLD, 12, plan, ADDRESSES)
    assert set(built.each) == set(WORLD)
    whole = {host: built.message(host) for host in WORLD}
    for host in WORLD:  # the line a member reads is the same start
        line = protocol.encode({"term": 0, **built.common} | built.each[host])
        assert messages.Start.model_validate(protocol.decode(line)) == whole[host]
    return whole


def test_each_host_gets_its_rank_in_the_world_and_the_world_and_coordinator_every_host_gets():
    for rank, (host, start) in enumerate(starts().items()):
        assert (host, start.rank) == (WORLD[rank], rank)
        shared = (start.hosts, start.coordinator, start.generation, start.restore_step)
        assert shared == (WORLD, "h0:3", 3, 12)


def test_each_host_gets_its_own_sources_and_replica_holders():
    made = starts()
    assert made[5].sources == [
        {"tier": "peer", "holder": 1, "address": "10.0.0.1:9000", "owner": 4},
        {"tier": "persistent"},
    ]
    assert all(start.sources == [] for host, start in made.items() if host != 5)
    assert made[1].replica_addresses == {5: "10.0.0.5:9000"}  # the same worker of the next slice
    assert made[0].replica_addresses == {1: "10.0.0.1:9000"}  # host 4 is out: the next in the ring
    everyone = starts(peer_replicas=None)
    assert everyone[3].replica_addresses == ADDRESSES
