"""The journal written on a few replicas as changes: what a replica holds equals what the leader wrote,
what a command costs does not grow with the job's history, replicas are spread over slices and
replaced when lost (supervisor.leader.journal, supervisor.leader.journal_delta)."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader import journal_delta
from slicekeeper.supervisor.leader.journal import JOURNAL_REPLICAS, JournalWriter, received

from slicekeeper.shape import host_ranges, parse_host_ranges

SLICE = 4


class FakeMembers:
    """Connections by host; what each was sent, as the wire carries it."""

    def __init__(self, hosts: range) -> None:
        self.writers: dict[int, Any] = {host: object() for host in hosts}
        self.sent: list[tuple[int, bytes]] = []
        self.leading = lambda: True

    def live(self) -> set[int]:
        return set(self.writers)

    async def send(self, host: int, message: messages.Message) -> None:
        self.sent.append((host, message.encode()))


class Replica:
    """A member as the real one keeps the journal: every line decoded, `received` applied."""

    def __init__(self) -> None:
        self.held: messages.Journal | None = None

    def take(self, line: bytes) -> None:
        command = messages.command(line)
        assert isinstance(command, messages.Journal)
        self.held = received(self.held, command)


def history(faults: int) -> dict[str, Any]:
    return {
        "memory": {
            "state": "running",
            "generation": faults,
            "faults": [{"host": i % 7, "step": 10 * i, "detected_at": None} for i in range(faults)],
            "restarts": {"crash": faults},
        },
        "world": {"active": [0, 1, 2], "history": []},
        "remediation": {"decisions": [{"action": "restart", "step": i} for i in range(faults)]},
    }


def write_all(writer: JournalWriter) -> None:
    asyncio.run(writer.write())


class TestChanges:
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=2), inner, max_size=4),
        max_leaves=20,
    )

    @settings(max_examples=300, deadline=None)
    @given(old=json_values, new=json_values)
    def test_a_change_applied_to_the_old_journal_gives_the_new_one(self, old: Any, new: Any) -> None:
        journal_old, journal_new = {"j": old}, {"j": new}
        change = journal_delta.diff(journal_old, journal_new)
        wire = json.loads(json.dumps(change))  # as a replica reads it
        assert journal_delta.apply(copy.deepcopy(journal_old), wire) == journal_new

    def test_an_entry_changed_inside_a_long_list_costs_that_entry_only(self) -> None:
        old = history(500)
        new = copy.deepcopy(old)
        new["memory"]["faults"][-1]["detected_at"] = 12.5
        new["memory"]["faults"].append({"host": 1, "step": 5000, "detected_at": None})
        change = journal_delta.diff(old, new)
        assert change == [
            ["set", ["memory", "faults", 499, "detected_at"], 12.5],
            ["extend", ["memory", "faults"], [{"host": 1, "step": 5000, "detected_at": None}]],
        ]

    def test_a_change_made_against_another_journal_is_refused(self) -> None:
        with pytest.raises(ValueError, match=r"no \[.memory., .faults.\] in the journal"):
            journal_delta.apply({"memory": {}}, [["extend", ["memory", "faults"], [1]]])
        with pytest.raises(ValueError, match="not an operation"):
            journal_delta.apply({}, [["rename", ["a"]]])


class TestReplicas:
    def test_replicas_are_spread_over_slices_and_get_the_journal_whole_once_then_changes(self) -> None:
        members = FakeMembers(range(40))
        state = history(3)
        writer = JournalWriter(members, lambda: state, lambda host: host // SLICE)
        write_all(writer)
        replicas = sorted(writer.replicas)
        assert len(replicas) == JOURNAL_REPLICAS
        assert len({host // SLICE for host in replicas}) == JOURNAL_REPLICAS
        assert sorted(host for host, _ in members.sent) == replicas  # nobody else
        first = [json.loads(line) for _, line in members.sent]
        assert all(message["journal"] == state and message.get("change") is None for message in first)

        members.sent.clear()
        state["memory"]["state"] = "stopping"
        write_all(writer)
        second = [json.loads(line) for _, line in members.sent]
        assert sorted(host for host, _ in members.sent) == replicas
        assert all(
            m["base"] == 1 and m["change"] == [["set", ["memory", "state"], "stopping"]] for m in second
        )

    def test_what_a_replica_holds_is_what_the_leader_wrote(self) -> None:
        members = FakeMembers(range(12))
        state = history(2)
        writer = JournalWriter(members, lambda: state, lambda host: host // SLICE)
        replicas = {host: Replica() for host in range(12)}
        for round_ in range(6):
            state["memory"]["generation"] += 1
            state["memory"]["faults"].append({"host": round_, "step": round_, "detected_at": None})
            state["memory"]["faults"][0]["detected_at"] = float(round_)
            if round_ == 3:
                lost = writer.replicas[0]
                del members.writers[lost]  # a replica lost: another takes its place, whole
            members.sent.clear()
            write_all(writer)
            for host, line in members.sent:
                replicas[host].take(line)
            for host in writer.replicas:
                held = replicas[host].held
                assert held is not None and held.seq == writer.seq
                assert held.journal == json.loads(json.dumps(state))

    def test_a_command_costs_the_same_however_long_the_history(self) -> None:
        costs = []
        for faults in (10, 1000):
            members = FakeMembers(range(40))
            state = history(faults)
            writer = JournalWriter(members, lambda state=state: state, lambda host: host // SLICE)
            write_all(writer)
            members.sent.clear()
            state["memory"]["state"] = "stopping"
            state["memory"]["faults"].append({"host": 3, "step": 1, "detected_at": None})
            write_all(writer)
            costs.append(sum(len(line) for _, line in members.sent))
        assert costs[0] == costs[1]

    def test_negative_control_the_whole_journal_on_every_member_grows_with_history(self) -> None:
        """What the writer replaced: the whole journal to every member, at every command."""
        costs = []
        for faults in (10, 1000):
            line = messages.Journal(seq=2, journal=history(faults)).encode()
            costs.append(len(line) * 40)
        assert costs[1] > 50 * costs[0]

    def test_a_fenced_leader_writes_nothing_and_its_next_write_builds_on_what_replicas_hold(self) -> None:
        members = FakeMembers(range(8))
        state = history(1)
        writer = JournalWriter(members, lambda: state, lambda host: host // SLICE)
        replicas = {host: Replica() for host in range(8)}
        write_all(writer)
        members.leading = lambda: False
        state["memory"]["state"] = "stopping"
        write_all(writer)
        assert [host for host, line in members.sent if b'"stopping"' in line] == []  # nothing left
        members.leading = lambda: True
        state["memory"]["generation"] = 9
        write_all(writer)
        for host, line in members.sent:
            replicas[host].take(line)
        for host in writer.replicas:
            held = replicas[host].held
            assert held is not None and held.journal == state

    def test_a_change_against_a_journal_not_held_leaves_the_held_one(self) -> None:
        held = messages.Journal(seq=4, journal={"memory": {"state": "running"}})
        stray = messages.Journal(seq=9, base=8, change=[["set", ["memory", "state"], "failed"]])
        assert received(held, stray) is held
        assert received(None, stray) is None

    def test_a_journal_is_whole_or_a_change_not_both(self) -> None:
        with pytest.raises(ValueError, match="whole or as a change"):
            messages.Journal(seq=2, journal={"a": 1}, base=1, change=[])
        with pytest.raises(ValueError, match="names the journal it changes"):
            messages.Journal(seq=2, change=[])


class TestHostRanges:
    @given(st.lists(st.integers(0, 60), max_size=40))
    def test_any_list_of_hosts_comes_back_in_order(self, hosts: list[int]) -> None:
        assert parse_host_ranges(host_ranges(hosts)) == hosts

    def test_a_world_of_25000_hosts_is_one_run(self) -> None:
        start = messages.Start(
            generation=1, coordinator="c:1", restore_step=None, world=list(range(25000)), rank=7
        )
        line = start.encode()
        assert b'"world":"0-24999"' in line and len(line) < 300
        assert messages.command(line) == start

    def test_a_bad_run_is_named(self) -> None:
        with pytest.raises(ValueError, match="'9-3'"):
            parse_host_ranges("0-4,9-3")
