"""The supervisors' messages: every one goes over the wire and comes back equal; bad lines are named."""

import json

import pytest
from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoint_vocabulary import Tier
from slicekeeper.supervisor.checkpoints.restore_plan import Source

MEMBER_REPORTS = [
    messages.Register(
        host=1, t=1.0, machine="host-1", metrics_port=9000, replica_address="127.0.0.1:1", pid=7
    ),
    messages.StateReport(host=1, t=1.0, state="starting"),
    messages.Progress(host=1, t=1.0, generation=2, step=30, loss=0.5, work=0.1, core=1),
    messages.Committed(host=1, t=1.0, step=30),
    messages.CheckpointInvalid(host=1, t=1.0, step=30, tier="peer", reason="replication failed", detail="x"),
    messages.Persisted(host=1, t=1.0, step=30),
    messages.Restored(host=1, t=1.0, step=30, tier="peer", holder=3, seconds=0.2, bytes=10),
    messages.Loaded(host=1, t=1.0, generation=2, step=30),
    messages.ChaosFired(host=1, t=1.0, kind="kill", step=30, fault="kill:host=1@step=30", generation=2),
    messages.Fault(host=1, t=1.0, generation=2, kind="crash", exit_code=1, signal=None, detail="exit 1"),
    messages.ActivityReport(
        host=1, t=1.0, generation=2, step=31, stage="begun", phase="idle", silent_seconds=3.0
    ),
    messages.Stopped(host=1, t=1.0, generation=2, committed=[10, 20], replicas={0: [10]}),
    messages.Finished(host=1, t=1.0, generation=2, step=100, fingerprint="abc"),
    messages.RegisterSpare(spare=0, machine="spare-0", chaos="spare@step=10"),
    messages.Watch(),
]
COMMANDS = [
    messages.Journal(seq=3, journal={"memory": {"generation": 1}}),
    messages.Stop(generation=2, kind="crash", host=1),
    messages.Start(
        generation=3,
        coordinator="127.0.0.1:5",
        restore_step=20,
        sources=[{"tier": "local"}],
        replica_addresses={0: "127.0.0.1:6"},
        world=[0, 1],
        rank=1,
    ),
    messages.Park(generation=3, restore_step=20),
    messages.Retire(generation=3, reason="replaced (straggler)"),
    messages.Assign(host=2, generation=3, fired=["kill:host=2@step=5"]),
    messages.Shutdown(),
    messages.Failed(reason="budget spent"),
    messages.ActivityRequest(generation=2),
]


@pytest.mark.parametrize("message", MEMBER_REPORTS, ids=lambda m: m.type)
def test_what_members_say_reaches_the_leader_unchanged(message):
    assert messages.to_leader(message.encode()) == message


@pytest.mark.parametrize("message", COMMANDS, ids=lambda m: m.type)
def test_what_the_leader_commands_reaches_the_members_unchanged(message):
    assert messages.command(message.encode()) == message


def test_every_message_type_is_spoken_exactly_once():
    types = [m.type for m in [*MEMBER_REPORTS, *COMMANDS]]
    assert len(types) == len(set(types))


def test_a_report_missing_a_field_is_refused_naming_the_message_and_the_field():
    with pytest.raises(ValueError, match=r"fault\.generation"):
        messages.to_leader(json.dumps({"type": "fault", "host": 1, "kind": "crash"}))


def test_an_unknown_message_type_is_refused_naming_it():
    with pytest.raises(ValueError, match="'reboot'"):
        messages.to_leader(json.dumps({"type": "reboot", "host": 1}))


def test_a_command_is_not_taken_for_a_report():
    with pytest.raises(ValueError):
        messages.to_leader(messages.Shutdown().encode())


def test_fields_a_receiver_does_not_know_are_ignored():
    line = json.dumps({"type": "progress", "host": 1, "generation": 0, "step": 1, "t": 2.0, "newer": True})
    assert messages.to_leader(line) == messages.Progress(host=1, generation=0, step=1, t=2.0)


def test_a_report_names_its_host_once_its_supervisor_stamps_it_and_is_refused_before():
    built = messages.Persisted(step=30)  # as a part of a host's supervisor builds it
    with pytest.raises(ValueError, match="names no host"):
        messages.to_leader(built.encode().replace(b'"host":-1,', b""))
    stamped = built.model_copy(update={"host": 2})
    assert messages.to_leader(stamped.encode()) == stamped


def test_a_start_lists_each_source_with_only_what_it_names():
    sources = [
        Source(Tier.LOCAL).to_message({}),
        Source(Tier.PEER, holder=1, owner=3).to_message({1: "h1:7000"}),
        Source(Tier.PERSISTENT).to_message({}),
    ]
    start = messages.Start(
        generation=1, coordinator="c:1", restore_step=10, sources=sources, world=[0], rank=0
    )
    line = json.loads(start.encode())
    assert line["sources"] == [
        {"tier": "local"},
        {"tier": "peer", "holder": 1, "address": "h1:7000", "owner": 3},
        {"tier": "persistent"},
    ]
    assert messages.command(start.encode()) == start


def test_a_start_naming_a_tier_that_does_not_exist_is_refused_naming_the_source():
    line = messages.Start(generation=1, coordinator="c:1", restore_step=10, world=[0], rank=0).encode()
    bad = line.replace(b'"sources":[]', b'"sources":[{"tier":"tape"}]')
    with pytest.raises(ValueError, match=r"sources\.0\.tier"):
        messages.command(bad)
