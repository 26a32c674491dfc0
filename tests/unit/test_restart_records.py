"""A restart's records of its hosts: per host in a small world, summed up in a large one, so that
what a command adds to the journal does not grow with the job's size."""

import json
from types import SimpleNamespace
from typing import Any

import pytest
from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader import journal_delta, restart_records
from slicekeeper.supervisor.leader.checkpoints import Checkpoints
from slicekeeper.supervisor.leader.journal import JobMemory
from slicekeeper.supervisor.leader.restart_state import RestartState

from slicekeeper.report import build_report, format_report

GENERATION = 3


def checkpoints_of(hosts: int) -> Checkpoints:
    """The leader's checkpoint records for a world of `hosts`, in generation GENERATION."""
    memory = JobMemory(started_at=0.0, restart=RestartState(generation=GENERATION))
    world: Any = SimpleNamespace(hosts=list(range(hosts)))

    async def write_journal() -> None:
        pass

    return Checkpoints(memory, {}, world, None, None, keep=3, write_journal=write_journal)  # type: ignore[arg-type]


def restore(checkpoints: Checkpoints, host: int, step: int = 90, tier: str = "local") -> None:
    checkpoints.restored(
        messages.Restored(host=host, step=step, tier=tier, holder=None, seconds=0.01 * (host % 7), bytes=1000)
    )


def load(checkpoints: Checkpoints, host: int, step: int = 90) -> None:
    checkpoints.loaded(messages.Loaded(host=host, generation=GENERATION, step=step))


def held_by(hosts: int) -> dict[str, Any]:
    """What `hosts` hosts held at a stop, as Checkpoints.held writes it: steps 80 and 90 locally,
    host h's shard of both on its neighbour, step 80 persistent."""
    return {
        "live": list(range(hosts)),
        "local": {str(h): [80, 90] for h in range(hosts)},
        "replicas": {str((h + 1) % hosts): {str(h): [80, 90]} for h in range(hosts)},
        "persistent": {"80": list(range(hosts))},
        "invalid": {},
        "job_invalid": [],
        "rejoining": [],
    }


def restart(hosts: int) -> dict[str, Any]:
    """What a restart of `hosts` hosts adds to the job's memory: a recovery, and each host's restore
    staged and loaded."""
    checkpoints = checkpoints_of(hosts)
    for host in range(hosts):
        restore(checkpoints, host, tier="peer" if host % 100 == 0 else "local")
    for host in range(hosts):
        load(checkpoints, host)
    memory = checkpoints.memory
    memory.recoveries.append(
        {
            "generation": GENERATION,
            "world": restart_records.world(list(range(hosts))),
            "held": restart_records.held(held_by(hosts), hosts),
        }
    )
    return memory.to_json()


def journal_bytes_of_a_restart(hosts: int) -> int:
    before = JobMemory(started_at=0.0, restart=RestartState(generation=GENERATION)).to_json()
    return len(json.dumps(journal_delta.diff(before, restart(hosts))))


def test_a_small_worlds_restores_are_kept_per_host_with_the_step_each_loaded():
    checkpoints = checkpoints_of(4)
    for host in range(4):
        restore(checkpoints, host, tier="peer" if host == 2 else "local")
    load(checkpoints, 0)
    load(checkpoints, 1, step=80)
    restores = checkpoints.memory.restores
    assert [(r["host"], r["tier"], r["loaded_step"]) for r in restores] == [
        (0, "local", 90),
        (1, "local", 80),
        (2, "peer", None),
        (3, "local", None),
    ]


def test_a_large_worlds_restores_are_one_record_that_keeps_the_hosts_standing_out():
    hosts = restart_records.PER_HOST_UP_TO + 1
    checkpoints = checkpoints_of(hosts)
    for host in range(hosts):
        restore(checkpoints, host, step=80 if host == 7 else 90, tier="peer" if host < 5 else "local")
    for host in range(hosts):
        load(checkpoints, host, step=70 if host == 9 else 80 if host == 7 else 90)
    (summary,) = checkpoints.memory.restores
    assert summary["hosts"] == hosts and summary["step"] == 90
    assert summary["tiers"] == {"peer": 5, "local": hosts - 5}
    assert summary["bytes"] == 1000 * hosts and summary["seconds"] == pytest.approx(0.06)
    assert summary["loaded"] == hosts - 2
    assert [(r["host"], r["step"], r["loaded_step"]) for r in summary["unlike"]] == [(7, 80, 80), (9, 90, 70)]


def test_a_workload_loading_after_a_hand_over_is_still_counted():
    """A new leader has no staged restores of its own: the summed-up record is found by generation."""
    hosts = restart_records.PER_HOST_UP_TO + 1
    checkpoints = checkpoints_of(hosts)
    for host in range(hosts):
        restore(checkpoints, host)
    taken_over = checkpoints_of(hosts)
    taken_over.memory.take(JobMemory.from_json(checkpoints.memory.to_json()))
    load(taken_over, 0)
    load(taken_over, 1, step=40)
    (summary,) = taken_over.memory.restores
    assert summary["loaded"] == 1 and [r["host"] for r in summary["unlike"]] == [1]


def test_what_a_restart_adds_to_the_journal_does_not_grow_with_the_hosts():
    small, large = journal_bytes_of_a_restart(1_000), journal_bytes_of_a_restart(25_000)
    assert large < 2_000 and large < small * 1.5


def test_negative_control_records_kept_per_host_grow_with_the_hosts(monkeypatch):
    monkeypatch.setattr(restart_records, "PER_HOST_UP_TO", 10**9)
    small, large = journal_bytes_of_a_restart(1_000), journal_bytes_of_a_restart(25_000)
    assert large > small * 20 and large > 1 << 20


def test_what_a_large_world_held_is_counted_per_step_and_tier():
    held = restart_records.held(held_by(1_000), 1_000)
    assert held["live"] == "0-999" and held["rejoining"] == ""
    assert held["local"] == {"80": 1_000, "90": 1_000}
    assert held["replicas"] == {"80": 1_000, "90": 1_000}
    assert held["persistent"] == {"80": 1_000}
    assert restart_records.held(held_by(4), 4) == held_by(4)
    assert restart_records.world(list(range(4))) == [0, 1, 2, 3]
    assert restart_records.world([*range(500), *range(600, 1100)]) == "0-499,600-1099"


def test_the_report_says_a_large_worlds_tiers_and_shards():
    memory = restart(1_000)
    memory["recoveries"][0] |= {"cause": "crash", "host": 5, "restore_step": 90, "steps_replayed": 2}
    report = build_report(
        job_name="big", started_at=0.0, wall_seconds=10.0, hosts=[], summary={**memory, "steps_completed": 95}
    )
    text = format_report(report)
    assert "crash on host 5 -> step 90 (local 990, peer 10), 2 step(s) again" in text
    assert "restores          1000 shard(s)" in text
