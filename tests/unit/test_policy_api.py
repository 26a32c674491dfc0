"""The policy API users import: frozen typed data, the history helpers, JSON round trips, and a package
that loads nothing but the standard library."""

import dataclasses
import json
import subprocess
import sys

import pytest

from slicekeeper.policy import (
    Action,
    Budget,
    CapacityReturned,
    CheckpointInvalid,
    Context,
    Crash,
    Decision,
    DecisionSource,
    Event,
    Fail,
    Hang,
    HostLost,
    Ignore,
    Level,
    ReplaceHost,
    RestartInJob,
    ScaleDown,
    ScaleUp,
    Straggler,
    Wait,
)
from tests.support.policy_contexts import COMMON, budgets, context, world

EVENTS = [
    Crash(host=1, exit_code=1, signal=None, detail="exit 1", **COMMON),
    Crash(host=2, exit_code=None, signal="SIGKILL", detail="", **COMMON),
    Hang(host=0, silent_seconds=6.5, detail="no step", **COMMON),
    HostLost(host=3, machine="host-3", **COMMON),
    Straggler(host=2, score=1.8, **COMMON),
    CheckpointInvalid(host=1, checkpoint_step=30, reason="nonfinite_loss", detail="loss nan", **COMMON),
    CheckpointInvalid(host=1, checkpoint_step=None, reason="restore_failed", detail="", **COMMON),
    CapacityReturned(spares=1, **COMMON),
]
ACTIONS = [
    RestartInJob(),
    ReplaceHost(host=3),
    ScaleDown(),
    ScaleDown(slices=(1, 2)),
    ScaleUp(),
    Wait(seconds=10.0),
    Ignore(),
    Fail(reason="enough"),
]


def decided(event: Event, action: Action | None = None) -> Decision:
    action = action or RestartInJob()
    return Decision(event=event, action=action, source=DecisionSource.DEFAULT, reason="test", t=event.t)


# --- the data is frozen and typed ---------------------------------------------------------------------


def test_events_and_actions_are_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        Crash(1000.0, 40, 2, 1)  # type: ignore[misc]
    with pytest.raises(TypeError):
        ReplaceHost(3)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        EVENTS[0].host = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ACTIONS[1].host = 2  # type: ignore[misc]


def test_each_event_and_action_carries_its_kind_or_name():
    assert [e.kind for e in EVENTS] == [
        "crash",
        "crash",
        "hang",
        "host_lost",
        "straggler",
        "checkpoint_invalid",
        "checkpoint_invalid",
        "capacity_returned",
    ]
    assert [a.name for a in ACTIONS] == [
        "restart",
        "replace",
        "scale_down",
        "scale_down",
        "scale_up",
        "wait",
        "ignore",
        "fail",
    ]
    assert [a.level for a in ACTIONS] == ["restart", "replace", "scale_down", "scale_down"] + [None] * 4


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Wait(seconds=0), "Wait.seconds must be > 0"),
        (lambda: Wait(seconds=float("inf")), "Wait.seconds must be > 0"),
        (lambda: Fail(reason="  "), "Fail.reason must be a non-empty text"),
        (lambda: ReplaceHost(host=-1), "ReplaceHost.host must be a host index"),
        (lambda: ReplaceHost(host=True), "ReplaceHost.host must be a host index"),
        (lambda: ScaleDown(slices=(1, 1)), "ScaleDown.slices must be distinct slice indices"),
    ],
)
def test_an_action_that_cannot_mean_anything_cannot_be_built(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_world_geometry():
    full = world()
    assert full.hosts == (0, 1, 2, 3) and full.size == 4
    assert dict(full.mesh) == {"replica": 2, "fsdp": 2, "model": 4}
    assert [full.slice_of(h) for h in range(4)] == [0, 0, 1, 1]
    assert not full.scaled_down and full.dropped_slices == ()
    shrunk = world(active=(0,), restorable=1, idle=(2,))
    assert (
        shrunk.hosts == (0, 1)
        and shrunk.size == 2
        and dict(shrunk.mesh) == {"replica": 1, "fsdp": 2, "model": 4}
    )
    assert shrunk.scaled_down and shrunk.dropped_slices == (1,)


def test_a_budget_tells_what_is_left_and_never_less_than_nothing():
    assert Budget(level=Level.RESTART, limit=10, window_seconds=60, used=3).left == 7
    assert Budget(level=Level.RESTART, limit=2, window_seconds=60, used=5).left == 0


def test_the_context_is_read_only_and_independent_of_what_built_it():
    scores = {0: 1.0}
    ctx = Context(
        now=1.0,
        step=1,
        generation=0,
        history=[],
        budgets=budgets(),
        spares=0,
        scores=scores,
        world=world(),
        stragglers=[2],
    )
    scores[0] = 9.0
    assert ctx.scores[0] == 1.0
    with pytest.raises(TypeError):
        ctx.scores[0] = 5.0  # type: ignore[index]
    with pytest.raises(TypeError):
        ctx.budgets[Level.RESTART] = budgets()[Level.REPLACE]  # type: ignore[index]
    assert isinstance(ctx.history, tuple) and ctx.stragglers == (2,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.spares = 3  # type: ignore[misc]


def test_a_context_needs_every_budget():
    with pytest.raises(ValueError, match="lacks level"):
        Context(
            now=1.0,
            step=1,
            generation=0,
            history=(),
            budgets={Level.RESTART: budgets()[Level.RESTART]},
            spares=0,
            scores={},
            world=world(),
        )


# --- history helpers -----------------------------------------------------------------------------------


def test_faults_on_counts_each_fault_of_the_host_once_within_the_window():
    old = Crash(host=1, t=100.0, step=5, generation=0)
    recent = Hang(host=1, t=900.0, step=30, generation=1)
    lost = HostLost(host=1, t=950.0, step=35, generation=2)
    other = Crash(host=2, t=950.0, step=35, generation=2)
    slow = Straggler(host=1, score=2.0, t=960.0, step=36, generation=2)
    lost_again = dataclasses.replace(lost, t=955.0)
    history = (
        decided(old),
        decided(recent),
        decided(lost, Wait(seconds=5)),
        decided(lost_again, ScaleDown()),  # offered again after the Wait: the same fault
        decided(other),
        decided(slow, Ignore()),
    )
    ctx = context(history=history, now=1000.0)
    assert ctx.faults_on(1) == 3
    assert ctx.faults_on(1, within_seconds=200) == 2
    assert ctx.faults_on(2) == 1
    assert ctx.faults_on(3) == 0
    assert ctx.faults(within_seconds=200) == (recent, lost_again, other)


def test_waited_seconds_is_how_long_an_event_has_been_put_off():
    lost = HostLost(host=3, t=100.0, step=5, generation=0)
    other = Crash(host=1, t=120.0, step=6, generation=0)
    waits = (
        Decision(event=lost, action=Wait(seconds=10), source=DecisionSource.USER, reason="", t=101.0),
        Decision(event=other, action=RestartInJob(), source=DecisionSource.USER, reason="", t=121.0),
        Decision(event=lost, action=Wait(seconds=10), source=DecisionSource.USER, reason="", t=131.0),
    )
    assert context(history=waits, now=150.0).waited_seconds(lost) == 49.0
    assert (
        context(history=waits, now=150.0).waited_seconds(HostLost(host=2, t=1, step=1, generation=0)) == 0.0
    )
    answered = (
        *waits,
        Decision(event=lost, action=ScaleDown(), source=DecisionSource.USER, reason="", t=140.0),
    )
    assert context(history=answered, now=150.0).waited_seconds(lost) == 0.0


# --- JSON ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.kind)
def test_every_event_survives_a_json_round_trip(event):
    encoded = json.loads(json.dumps(event.to_json()))
    assert encoded["kind"] == event.kind
    assert Event.from_json(encoded) == event


@pytest.mark.parametrize("action", ACTIONS, ids=repr)
def test_every_action_survives_a_json_round_trip(action):
    encoded = json.loads(json.dumps(action.to_json()))
    assert encoded["name"] == action.name
    assert Action.from_json(encoded) == action


def test_a_context_with_its_history_survives_a_json_round_trip():
    history = tuple(decided(e, a) for e, a in zip(EVENTS, ACTIONS, strict=False))
    ctx = context(history=history, the_world=world(active=(0,), restorable=1, idle=(2, 3)), restart=3)
    assert Context.from_json(json.loads(json.dumps(ctx.to_json()))) == ctx
    for decision in history:
        assert Decision.from_json(json.loads(json.dumps(decision.to_json()))) == decision


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kind": "meltdown", "t": 1.0, "step": 1, "generation": 0}, "unknown kind 'meltdown'"),
        ({"kind": "crash", "t": 1.0, "step": 1}, "crash event: missing field 'generation'"),
        ({"kind": "crash", "t": 1.0, "step": 1, "generation": 0}, "missing field 'host'"),
        (
            {"kind": "crash", "t": 1.0, "step": "one", "generation": 0, "host": 1},
            "crash event.step: expected a whole number",
        ),
        (
            {"kind": "host_lost", "t": 1.0, "step": 1, "generation": 0, "host": 1, "colour": "red"},
            "unknown field(s) colour",
        ),
        ([1, 2], "event: expected an object"),
    ],
)
def test_a_bad_event_record_names_the_problem(data, message):
    with pytest.raises(ValueError) as caught:
        Event.from_json(data)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "reboot"}, "unknown name 'reboot'"),
        ({"name": "replace"}, "missing field 'host'"),
        ({"name": "wait", "seconds": -1}, "Wait.seconds must be > 0"),
        ({"name": "scale_down", "slices": "1"}, "expected a list"),
    ],
)
def test_a_bad_action_record_names_the_problem(data, message):
    with pytest.raises(ValueError) as caught:
        Action.from_json(data)
    assert message in str(caught.value)


# --- the package -----------------------------------------------------------------------------------


def test_the_policy_api_imports_nothing_outside_the_standard_library():
    code = (
        "import sys, slicekeeper.policy, slicekeeper.policy.default\n"
        "print(sorted(m for m in ('pydantic', 'yaml', 'jax', 'numpy') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


PUBLIC_NAMES = (
    "ACTION_TYPES",
    "ALLOWED_ACTIONS",
    "EVENT_TYPES",
    "FAULT_KINDS",
    "HOOK_NAMES",
    "Action",
    "ActionName",
    "AnnouncedLoss",
    "Budget",
    "CapacityReturned",
    "CheckpointInvalid",
    "Context",
    "Crash",
    "Decision",
    "DecisionSource",
    "Event",
    "EventKind",
    "Fail",
    "Hang",
    "HostEvent",
    "HostLost",
    "Ignore",
    "Level",
    "Policy",
    "RecoveryCosts",
    "ReplaceHost",
    "RestartInJob",
    "ScaleDown",
    "ScaleUp",
    "Straggler",
    "Wait",
    "World",
    "check_action",
)
"""Every public name of the single module slicekeeper/policy.py, before it became a package."""


def test_a_policy_files_imports_come_from_the_package_which_loads_no_engine():
    # A user's policy file imports these by name (or with *, or as `policy.X`); the package must offer
    # them all without loading the engine, replay or the default ladder, which import the package.
    code = (
        "import json, sys\n"
        f"from slicekeeper.policy import {', '.join(PUBLIC_NAMES)}\n"
        "from slicekeeper import policy\n"
        f"missing = [n for n in {PUBLIC_NAMES!r} if not hasattr(policy, n)]\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('slicekeeper'))\n"
        "print(json.dumps({'missing': missing, 'all': sorted(policy.__all__), 'loaded': loaded}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    found = json.loads(result.stdout)
    assert found["missing"] == []
    assert found["all"] == sorted(PUBLIC_NAMES)
    for heavy in ("engine", "replay", "default"):
        assert f"slicekeeper.policy.{heavy}" not in found["loaded"]
