"""The restore plan: the newest step every host can restore, and each host's sources cheapest first."""

import pytest
from slicekeeper.supervisor.checkpoint_vocabulary import Tier
from slicekeeper.supervisor.checkpoints.restore_plan import Holdings, RestorePlan, Source, plan_restore

LOCAL = Source(Tier.LOCAL)
PERSISTENT = Source(Tier.PERSISTENT)


def peer(holder: int) -> Source:
    return Source(Tier.PEER, holder)


def holdings(
    local: dict[int, set[int]] | None = None,
    replicas: dict[int, dict[int, set[int]]] | None = None,
    persistent: set[int] | None = None,
    invalid: dict[int, set[int]] | None = None,
    job_invalid: set[int] | None = None,
) -> Holdings:
    return Holdings(
        local=local or {},
        replicas=replicas or {},
        persistent=persistent or set(),
        invalid=invalid or {},
        job_invalid=job_invalid or set(),
    )


EVERYONE = (0, 1, 2)

# (what the job holds, live hosts, expected step, expected sources per host)
CASES = {
    "the newest step every host holds locally is restored from the local tier": (
        holdings(local={0: {10, 20, 30}, 1: {10, 20, 30}, 2: {10, 20}}),
        EVERYONE,
        20,
        {0: (LOCAL,), 1: (LOCAL,), 2: (LOCAL,)},
    ),
    "sources are cheapest first: local, then peers by holder, then persistent": (
        holdings(
            local={0: {20}, 1: {20}, 2: {20}},
            replicas={2: {0: {20}}, 1: {0: {20}}},  # holders listed out of order on purpose
            persistent={20},
        ),
        EVERYONE,
        20,
        {
            0: (LOCAL, peer(1), peer(2), PERSISTENT),
            1: (LOCAL, PERSISTENT),
            2: (LOCAL, PERSISTENT),
        },
    ),
    "a replica on a holder that is not live does not count": (
        holdings(local={0: {10, 20}, 1: {10, 20}, 2: {10}}, replicas={1: {2: {20}}}),
        (0, 2),
        10,
        {0: (LOCAL,), 1: (LOCAL,), 2: (LOCAL,)},
    ),
    "a replica a host holds of its own shard does not count": (
        holdings(local={0: {20}, 1: {20}, 2: set()}, replicas={2: {2: {20}}}),
        EVERYONE,
        None,
        {0: (), 1: (), 2: ()},
    ),
    "a step invalid for one host is excluded from every tier for that host": (
        holdings(
            local={0: {10, 20}, 1: {10, 20}, 2: {10, 20}},
            replicas={0: {1: {20}}},
            persistent={20},
            invalid={1: {20}},
        ),
        EVERYONE,
        10,
        {0: (LOCAL,), 1: (LOCAL,), 2: (LOCAL,)},
    ),
    "a step invalid for the whole job is excluded from every tier for every host": (
        holdings(
            local={0: {10, 20}, 1: {10, 20}, 2: {10, 20}},
            replicas={0: {1: {20}}, 1: {0: {20}}},
            persistent={20},
            job_invalid={20},
        ),
        EVERYONE,
        10,
        {0: (LOCAL,), 1: (LOCAL,), 2: (LOCAL,)},
    ),
    "a lost host whose shard is held only by a peer restores that step from the peer": (
        holdings(local={0: {10, 20}, 1: {10, 20}, 2: set()}, replicas={0: {2: {10, 20}}, 2: {}}),
        EVERYONE,
        20,
        {0: (LOCAL,), 1: (LOCAL,), 2: (peer(0),)},
    ),
    "a lost host whose shard is only in the persistent tier restores the persistent step": (
        holdings(local={0: {10, 20}, 1: {10, 20}, 2: set()}, persistent={10}),
        EVERYONE,
        10,
        {0: (LOCAL, PERSISTENT), 1: (LOCAL, PERSISTENT), 2: (PERSISTENT,)},
    ),
    "a step held only as peer replicas is a candidate too": (
        holdings(local={}, replicas={0: {1: {30}}, 1: {0: {30}}}),
        (0, 1),
        30,
        {0: (peer(1),), 1: (peer(0),)},
    ),
    "a committed persistent step alone restores every host": (
        holdings(persistent={40, 50}),
        EVERYONE,
        50,
        {0: (PERSISTENT,), 1: (PERSISTENT,), 2: (PERSISTENT,)},
    ),
    "with no step complete across the hosts the plan has no step and no sources": (
        holdings(local={0: {10}, 1: {20}, 2: {10, 20}}, replicas={2: {0: {30}}}),
        EVERYONE,
        None,
        {0: (), 1: (), 2: ()},
    ),
    "with nothing held at all the job starts from scratch": (
        holdings(),
        EVERYONE,
        None,
        {0: (), 1: (), 2: ()},
    ),
}


@pytest.mark.parametrize(("held", "live", "step", "sources"), CASES.values(), ids=list(CASES))
def test_the_plan_picks_the_newest_step_every_host_can_restore(held, live, step, sources):
    assert plan_restore(sorted(sources), held, live) == RestorePlan(step, sources)


def test_only_the_hosts_asked_for_are_planned():
    held = holdings(local={0: {10}, 1: {10}, 5: set()})
    assert plan_restore([0, 1], held, live=[0, 1]) == RestorePlan(10, {0: (LOCAL,), 1: (LOCAL,)})


def test_live_hosts_may_be_any_iterable():
    held = holdings(local={0: {10}, 1: set()}, replicas={0: {1: {10}}})
    plan = plan_restore(range(2), held, live=(h for h in (0, 1)))
    assert plan == RestorePlan(10, {0: (LOCAL,), 1: (peer(0),)})


def test_the_plan_does_not_change_the_holdings_it_reads():
    held = holdings(local={0: {10, 20}, 1: {10}}, replicas={0: {1: {20}}}, persistent={5}, invalid={1: {20}})
    before = repr(held)
    plan_restore([0, 1], held, live=[0, 1])
    assert repr(held) == before


# --- Source.to_message ----------------------------------------------------------------------------

ADDRESSES = {0: "10.0.0.1:7000", 1: "10.0.0.2:7000", 2: "10.0.0.3:7000"}


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (LOCAL, {"tier": "local"}),
        (PERSISTENT, {"tier": "persistent"}),
        (peer(2), {"tier": "peer", "holder": 2, "address": "10.0.0.3:7000"}),
        (peer(0), {"tier": "peer", "holder": 0, "address": "10.0.0.1:7000"}),
    ],
    ids=["local", "persistent", "peer", "peer-host-0"],
)
def test_a_source_becomes_a_message_with_the_holders_address_for_a_peer(source, message):
    assert source.to_message(ADDRESSES) == message


def test_a_source_message_is_plain_json_values():
    message = peer(1).to_message(ADDRESSES)
    assert type(message["tier"]) is str
    assert message == {"tier": "peer", "holder": 1, "address": "10.0.0.2:7000"}
