"""Replay: a recorded event log read back exactly, and another policy's decisions shown beside it."""

import json
from pathlib import Path

import pytest

from slicekeeper.errors import UserError
from slicekeeper.policy import (
    CapacityReturned,
    Crash,
    DecisionSource,
    HostLost,
    Ignore,
    ReplaceHost,
    RestartInJob,
    ScaleDown,
    ScaleUp,
    Straggler,
    World,
)
from slicekeeper.policy.engine import PolicyEngine, load_policy
from slicekeeper.policy.replay import append_to_log, format_replay, log_record, read_log, replay

NO_HOT_SWAP = Path(__file__).parents[2] / "examples" / "policies" / "no_hot_swap.py"
FULL = World(active_slices=(0, 1), full_slices=2, min_slices=1, hosts_per_slice=2, devices_per_host=2)
SHRUNK = World(
    active_slices=(0,),
    full_slices=2,
    min_slices=1,
    hosts_per_slice=2,
    devices_per_host=2,
    restorable_slices=1,
)


def record_a_run(path: Path, engine: PolicyEngine | None = None):
    """The decisions of a run with a crash, a lost host (a spare was ready), a straggler, capacity back."""
    engine = engine or PolicyEngine()
    steps = [
        (Crash(host=1, exit_code=1, t=100.0, step=30, generation=0), {"spares": 1, "world": FULL}),
        (HostLost(host=3, machine="host-3", t=200.0, step=40, generation=1), {"spares": 1, "world": FULL}),
        (Straggler(host=2, score=1.9, t=300.0, step=60, generation=2), {"spares": 0, "world": FULL}),
        (CapacityReturned(spares=2, t=400.0, step=80, generation=2), {"spares": 2, "world": SHRUNK}),
    ]
    made = []
    for event, facts in steps:
        decision, context = engine.decide(
            event, now=event.t + 0.5, step=event.step, generation=event.generation, scores={2: 1.9}, **facts
        )
        append_to_log(path, decision, context)
        made.append((event, context, decision))
    return made


def test_a_recorded_log_reads_back_exactly_with_each_contexts_history(tmp_path):
    log = tmp_path / "policy-events.jsonl"
    made = record_a_run(log)
    assert len(log.read_text().splitlines()) == 4
    assert read_log(log) == made
    assert len(made[3][1].history) == 3


def test_a_log_line_holds_the_event_the_context_without_history_and_the_decision():
    engine = PolicyEngine()
    crash = Crash(host=1, exit_code=1, t=100.0, step=30, generation=0)
    decision, context = engine.decide(
        crash, now=100.5, step=30, generation=0, spares=0, scores={}, world=FULL
    )
    line = json.loads(json.dumps(log_record(decision, context)))
    assert line["event"] == {
        "kind": "crash",
        "t": 100.0,
        "step": 30,
        "generation": 0,
        "host": 1,
        "exit_code": 1,
        "signal": None,
        "detail": "",
    }
    assert line["context"]["history_length"] == 0 and "history" not in line["context"]
    assert line["decision"] == {
        "action": {"name": "restart"},
        "source": "default",
        "reason": "default policy (no user policy)",
        "t": 100.5,
    }


def test_replay_with_the_recording_policy_takes_the_same_decisions(tmp_path):
    log = tmp_path / "policy-events.jsonl"
    record_a_run(log)
    pairs = replay(read_log(log), PolicyEngine())
    assert [recorded for recorded, _ in pairs] == [replayed for _, replayed in pairs]
    assert format_replay(pairs, policy="default policy").endswith("0 of 4 decision(s) differ\n")


def test_replay_with_another_policy_shows_where_it_differs(tmp_path):
    log = tmp_path / "policy-events.jsonl"
    record_a_run(log)
    pairs = replay(read_log(log), PolicyEngine(load_policy(NO_HOT_SWAP)))
    assert [(r.action, p.action, p.source) for r, p in pairs] == [
        (RestartInJob(), RestartInJob(), DecisionSource.USER),
        (ReplaceHost(host=3), ScaleDown(), DecisionSource.USER),
        (Ignore(), Ignore(), DecisionSource.USER),
        (ScaleUp(), ScaleUp(), DecisionSource.USER),
    ]
    table = format_replay(pairs, policy="no_hot_swap.py").splitlines()
    assert table[0].split() == ["t", "step", "event", "recorded", "replayed", "(no_hot_swap.py)"]
    lost_row = next(line for line in table if "host_lost on host 3" in line)
    assert "ReplaceHost(host=3) [default]" in lost_row and "ScaleDown(slices=()) [user]" in lost_row
    assert lost_row.endswith("*")
    assert sum(line.endswith("*") for line in table) == 1
    assert table[-1] == "1 of 4 decision(s) differ"


def test_replay_judges_each_event_in_its_recorded_context_and_runs_nothing_else(tmp_path):
    log = tmp_path / "policy-events.jsonl"
    record_a_run(log)
    engine = PolicyEngine(load_policy(NO_HOT_SWAP))
    replay(read_log(log), engine)
    assert engine.history == ()  # evaluate only: nothing recorded, no budget charged


def test_a_replayed_fallback_is_explained_under_its_row(tmp_path):
    log = tmp_path / "policy-events.jsonl"
    record_a_run(log)
    broken = tmp_path / "broken.py"
    broken.write_text("def on_crash(event, context):\n    raise RuntimeError('not today')\n")
    text = format_replay(replay(read_log(log), PolicyEngine(load_policy(broken))), policy="broken.py")
    assert (
        "    replayed: on_crash in broken.py raised RuntimeError: not today; the default policy decided"
        in text
    )


def test_an_empty_log_says_so(tmp_path):
    log = tmp_path / "policy-events.jsonl"
    log.write_text("\n")
    assert (
        format_replay(replay(read_log(log), PolicyEngine()), policy="x")
        == "no decisions recorded in the event log\n"
    )


def test_a_missing_log_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match=r"nope\.jsonl: cannot read the event log: No such file"):
        read_log(tmp_path / "nope.jsonl")


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", ":2: not valid JSON: Expecting property name"),
        (
            '{"event": {}}',
            ":2: not a policy decision record: expected an object with event, context and decision",
        ),
        (
            '{"event": {"kind": "crash"}, "context": {}, "decision": {}}',
            ":2: not a policy decision record: crash event: missing field",
        ),
    ],
)
def test_a_bad_line_is_named_by_file_and_line(tmp_path, bad_line, message):
    log = tmp_path / "policy-events.jsonl"
    record_a_run(log)
    lines = log.read_text().splitlines()
    log.write_text("\n".join([lines[0], bad_line, *lines[1:]]) + "\n")
    with pytest.raises(UserError) as caught:
        read_log(log)
    assert str(caught.value).startswith(f"{log}{message}")


def test_a_log_that_starts_mid_run_replays_with_the_history_it_has(tmp_path):
    log = tmp_path / "policy-events.jsonl"
    made = record_a_run(log)
    log.write_text("\n".join(log.read_text().splitlines()[2:]) + "\n")
    records = read_log(log)
    assert [len(context.history) for _, context, _ in records] == [0, 1]
    assert [decision for _, _, decision in records] == [decision for _, _, decision in made[2:]]
