"""The control-plane benchmark's own checks (benchmarks/control_plane_scale.py): its simulated hosts
speak the real protocol, its check that each host was stopped and started exactly once in a round
fails on a host started twice and another never, and its check that a new leader carried on its
predecessor's journal fails on a journal that lost something. The benchmark itself runs at 200 hosts in
tests/integration/test_control_plane_scale.py."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from slicekeeper.supervisor import messages

from benchmarks.control_plane_figures import TARGETS, misses
from benchmarks.control_plane_members import MemberProcess, SimulatedHost, Stats
from benchmarks.control_plane_scale import BenchmarkFailed, Run, _cpu_at, continues, not_once_each
from slicekeeper import credentials


class Wire:
    """A connection's writing end that keeps the lines."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.lines.append(data)

    def is_closing(self) -> bool:
        return False


def journal(faults: int) -> dict[str, Any]:
    return {
        "memory": {
            "generation": faults,
            "restarts": {"crash": faults},
            **{name: [{"n": i} for i in range(faults)] for name in ("faults", "detections", "recoveries")},
            **{name: [] for name in ("restores", "hot_swaps", "leader_changes")},
        },
        "remediation": {"decisions": [{"n": i} for i in range(faults)]},
        "world": {"active": [0], "history": [{"slices": [0]}]},
    }


def test_every_line_a_simulated_host_says_is_one_the_leader_reads(tmp_path: Path) -> None:
    credentials.generate("bench").write(tmp_path / "credentials")
    process = MemberProcess(range(7, 8), tmp_path, step_seconds=1.0)
    host = SimulatedHost(7, process)
    wire = Wire()
    host.writer = wire  # type: ignore[assignment]
    host._register(term=1)
    host.generation, host.training, host.rank, host.progress_every = 3, True, 7, 4
    for _ in range(10):
        host.tick()
    host.joined, host.journal_seq = True, None
    host._register(term=2)
    kinds = [type(messages.to_leader(line)).__name__ for line in wire.lines]
    assert kinds.count("Register") == 2 and "Committed" in kinds
    progress = [messages.to_leader(line) for line in wire.lines if b'"progress"' in line]
    reported = [p.step for p in progress] + [step for p in progress for step, _, _ in p.earlier]
    assert sorted(reported) == list(range(1, 11))  # every step, once, whether alone or held back
    assert len(progress) < 10


class TestEachHostOnce:
    def test_each_host_of_the_world_once_passes(self) -> None:
        assert not_once_each([3, 0, 2, 1], range(4)) is None

    @pytest.mark.parametrize(
        ("received", "said"),
        [
            ([0, 1, 1, 3], "more than once: [1]; never: [2]"),  # four, as a total would want
            ([0, 1, 2], "never: [3]"),
            ([0, 1, 2, 3, 3], "more than once: [3]"),
            ([0, 1, 2, 3, 7], "outside the world: [7]"),
            ([], "never: [0, 1, 2, 3]"),
        ],
    )
    def test_negative_control_a_host_missing_repeated_or_foreign_fails(
        self, received: list[int], said: str
    ) -> None:
        assert not_once_each(received, range(4)) == said

    def test_at_scale_the_first_few_hosts_are_named(self) -> None:
        said = not_once_each([], range(25_000))
        assert said == "never: [0, 1, 2, 3, 4] ..."


def process_stats(stopped: list[int], started: list[int]) -> dict[str, Any]:
    """One member process's report of generation 4's stops and generation 5's starts, with the counts."""
    stats = Stats()
    stats.stop_hosts[4], stats.stop_count[4] = stopped, len(stopped)
    stats.start_hosts[5], stats.start_count[5] = started, len(started)
    return stats.to_json()


class TestRoundCheck:
    """Run.check_round over the member processes' merged reports (hosts 0-1 in one, 2-3 in the other)."""

    def test_a_round_where_each_host_stopped_and_started_once_passes(self) -> None:
        merged = Stats.merged([process_stats([1, 0], [0, 1]), process_stats([2, 3], [3, 2])])
        Run.check_round(SimpleNamespace(hosts=4), merged, 4)  # type: ignore[arg-type]

    def test_negative_control_a_host_started_twice_and_another_never_fails_with_the_totals_right(
        self,
    ) -> None:
        merged = Stats.merged([process_stats([0, 1], [0, 1, 1]), process_stats([2, 3], [3])])
        assert merged.stop_count[4] == merged.start_count[5] == 4  # what the check counted before
        with pytest.raises(BenchmarkFailed, match=r"started more than once: \[1\]; never: \[2\]"):
            Run.check_round(SimpleNamespace(hosts=4), merged, 4)  # type: ignore[arg-type]


class TestJournalCarriedOn:
    def test_a_journal_that_adds_to_every_record_carries_on(self) -> None:
        before = journal(5)
        after = copy.deepcopy(before)
        after["memory"]["faults"].append({"n": 5})
        after["memory"]["restarts"]["host_lost"] = 1
        after["memory"]["leader_changes"].append({"term": 2})
        assert continues(before, after) is None

    @pytest.mark.parametrize(
        ("what", "lose"),
        [
            ("memory.faults", lambda j: j["memory"]["faults"].pop()),
            ("memory.restarts", lambda j: j["memory"]["restarts"].update(crash=0)),
            ("remediation.decisions", lambda j: j["remediation"]["decisions"].clear()),
            ("memory.generation", lambda j: j["memory"].update(generation=0)),
        ],
    )
    def test_negative_control_a_journal_that_lost_something_does_not(self, what: str, lose: Any) -> None:
        before = journal(5)
        after = copy.deepcopy(before)
        lose(after)
        reason = continues(before, after)
        assert reason is not None and what in reason

    def test_negative_control_a_leader_starting_afresh_does_not(self) -> None:
        assert continues(journal(5), journal(0)) is not None


def test_a_figure_over_its_target_is_named_as_missed_and_one_within_is_not():
    within = {key: (target or 0) / 2 for key, (_, target) in TARGETS.items()} | {"hosts": 1000}
    assert misses([within]) == []
    over = within | {"handover_s": 14.83}
    assert misses([over]) == ["hand-over (s) at 1,000 hosts: 14.83 over the target 10.0"]


def test_a_process_cpu_time_at_a_moment_is_interpolated_between_what_it_said():
    said = [(10.0, 1.0), (10.5, 1.2), (11.0, 2.2)]
    assert _cpu_at(said, 10.75) == pytest.approx(1.7)
    assert _cpu_at(said, 10.5) == pytest.approx(1.2)
    assert (_cpu_at(said, 9.0), _cpu_at(said, 12.0)) == (1.0, 2.2)  # outside: the nearest said
