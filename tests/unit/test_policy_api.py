"""The policy API users import: frozen typed data, JSON round trips, the allowed-actions table, checks."""

import dataclasses
import json
import subprocess
import sys

import pytest

from slicekeeper.policy import (
    ALLOWED_ACTIONS,
    Action,
    ActionName,
    Budget,
    CapacityReturned,
    CheckpointInvalid,
    Context,
    Crash,
    Decision,
    DecisionSource,
    Event,
    EventKind,
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
    World,
    check_action,
)

COMMON = {"t": 1000.0, "step": 40, "generation": 2}

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


def world(*, active=(0, 1), full=2, min_slices=1, restorable=0, idle=()) -> World:
    return World(
        active_slices=active,
        full_slices=full,
        min_slices=min_slices,
        hosts_per_slice=2,
        devices_per_host=4,
        idle_hosts=idle,
        restorable_slices=restorable,
    )


def budgets(restart=0, replace=0, scale_down=0) -> dict[Level, Budget]:
    used = {Level.RESTART: restart, Level.REPLACE: replace, Level.SCALE_DOWN: scale_down}
    limits = {Level.RESTART: 10, Level.REPLACE: 4, Level.SCALE_DOWN: 4}
    return {lv: Budget(level=lv, limit=limits[lv], window_seconds=3600.0, used=used[lv]) for lv in Level}


def context(*, spares=1, history=(), the_world=None, now=1001.0, **used) -> Context:
    return Context(
        now=now,
        step=40,
        generation=2,
        history=history,
        budgets=budgets(**used),
        spares=spares,
        scores={0: 1.0, 1: 1.02, 2: 1.8, 3: 0.99},
        world=the_world or world(),
        stragglers=(2,),
    )


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


# --- what each event allows, and what is feasible ----------------------------------------------------


ONE_OF_EACH_ACTION = {
    ActionName.RESTART: RestartInJob(),
    ActionName.REPLACE: ReplaceHost(host=3),
    ActionName.SCALE_DOWN: ScaleDown(slices=(1,)),
    ActionName.SCALE_UP: ScaleUp(),
    ActionName.WAIT: Wait(seconds=1),
    ActionName.IGNORE: Ignore(),
    ActionName.FAIL: Fail(reason="no"),
}
EVENT_OF_KIND = {
    EventKind.CRASH: Crash(host=3, **COMMON),
    EventKind.HANG: Hang(host=3, **COMMON),
    EventKind.HOST_LOST: HostLost(host=3, **COMMON),
    EventKind.STRAGGLER: Straggler(host=3, score=2.0, **COMMON),
    EventKind.CHECKPOINT_INVALID: CheckpointInvalid(host=3, reason="nonfinite_loss", **COMMON),
    EventKind.CAPACITY_RETURNED: CapacityReturned(spares=1, **COMMON),
}


def test_the_allowed_actions_table_is_the_documented_one():
    fault = {"restart", "replace", "scale_down", "wait", "fail"}
    assert dict(ALLOWED_ACTIONS) == {
        "crash": fault,
        "hang": fault,
        "checkpoint_invalid": fault,
        "host_lost": {"replace", "scale_down", "wait", "fail"},
        "straggler": {"replace", "scale_down", "ignore", "wait", "fail"},
        "capacity_returned": {"scale_up", "ignore", "wait"},
    }


@pytest.mark.parametrize("kind", list(EventKind))
@pytest.mark.parametrize("name", list(ActionName))
def test_check_action_refuses_exactly_the_actions_an_event_does_not_allow(kind, name):
    # A context where every action is feasible: one slice already dropped and restorable, spare, budgets.
    roomy = context(
        the_world=World(
            active_slices=(0, 1, 2),
            full_slices=4,
            min_slices=1,
            hosts_per_slice=2,
            devices_per_host=4,
            restorable_slices=1,
        )
    )
    problem = check_action(EVENT_OF_KIND[kind], ONE_OF_EACH_ACTION[name], roomy)
    if name in ALLOWED_ACTIONS[kind]:
        assert problem is None
    else:
        assert (
            problem
            == f"a {kind} event does not allow '{name}' (allowed: {', '.join(sorted(ALLOWED_ACTIONS[kind]))})"
        )


CRASH_ON_3 = Crash(host=3, **COMMON)
LOST_3 = HostLost(host=3, **COMMON)


@pytest.mark.parametrize(
    ("event", "action", "ctx", "problem"),
    [
        (CRASH_ON_3, "restart", context(), "it is not an Action (a str"),
        (
            CRASH_ON_3,
            RestartInJob(),
            context(restart=10),
            "the restart budget is spent (10 of 10 within 3600 s",
        ),
        (CRASH_ON_3, ReplaceHost(host=3), context(spares=0), "no spare is available"),
        (CRASH_ON_3, ReplaceHost(host=3), context(replace=4), "spec.policy.budgets.replace"),
        (CRASH_ON_3, ReplaceHost(host=7), context(), "host 7 is not an active host of the job"),
        (LOST_3, ReplaceHost(host=2), context(), "only the lost host (3) can be replaced"),
        (CRASH_ON_3, ScaleDown(), context(the_world=world(min_slices=2)), "below spec.minSlices=2"),
        (CRASH_ON_3, ScaleDown(slices=(0, 1)), context(), "leave 0 slice(s), below spec.minSlices=1"),
        (CRASH_ON_3, ScaleDown(slices=(5,)), context(), "slice(s) [5] not active"),
        (CRASH_ON_3, ScaleDown(), context(scale_down=4), "spec.policy.budgets.scaleDown"),
        (LOST_3, ScaleDown(slices=(0,)), context(), "the lost host 3 is in slice 1, which it keeps"),
        (CapacityReturned(spares=1, **COMMON), ScaleUp(), context(), "already runs on all its slices"),
        (
            CapacityReturned(spares=1, **COMMON),
            ScaleUp(),
            context(the_world=world(active=(0,), restorable=0)),
            "no dropped slice can be restored now",
        ),
    ],
)
def test_check_action_refuses_what_cannot_be_done_now(event, action, ctx, problem):
    found = check_action(event, action, ctx)
    assert found is not None and problem in found


def test_the_feasible_versions_pass_the_check():
    assert check_action(CRASH_ON_3, ScaleDown(), context()) is None
    assert check_action(LOST_3, ReplaceHost(host=3), context()) is None
    assert check_action(LOST_3, ScaleDown(), context()) is None
    shrunk = context(the_world=world(active=(0,), restorable=1))
    assert check_action(CapacityReturned(spares=2, **COMMON), ScaleUp(), shrunk) is None


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
