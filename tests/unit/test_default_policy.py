"""The default policy, the escalation ladder: cheapest remedy first, budgets respected, clear failures."""

import itertools

import pytest

from slicekeeper.policy import (
    HOOK_NAMES,
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
    World,
    check_action,
)
from slicekeeper.policy.default import EscalationLadder

NOW = 10_000.0
LADDER = EscalationLadder()
LIMITS = {Level.RESTART: 10, Level.REPLACE: 4, Level.SCALE_DOWN: 4}


def situation(
    *,
    spares: int = 0,
    spent: tuple[Level, ...] = (),
    active: tuple[int, ...] = (0, 1),
    full: int = 2,
    min_slices: int = 1,
    restorable: int = 0,
    faults_of_host: dict[int, list[float]] | None = None,
) -> Context:
    """A two-host-per-slice job at NOW; `faults_of_host` gives earlier crash times per host."""
    history = tuple(
        Decision(
            event=Crash(host=host, t=t, step=1, generation=0),
            action=RestartInJob(),
            source=DecisionSource.DEFAULT,
            reason="",
            t=t,
        )
        for host, times in (faults_of_host or {}).items()
        for t in times
    )
    return Context(
        now=NOW,
        step=100,
        generation=3,
        history=history,
        budgets={
            lv: Budget(
                level=lv, limit=LIMITS[lv], window_seconds=3600.0, used=LIMITS[lv] if lv in spent else 0
            )
            for lv in Level
        },
        spares=spares,
        scores={},
        world=World(
            active_slices=active,
            full_slices=full,
            min_slices=min_slices,
            hosts_per_slice=2,
            devices_per_host=2,
            restorable_slices=restorable,
        ),
    )


def crash(host: int = 3) -> Crash:
    return Crash(host=host, exit_code=1, signal=None, detail="", t=NOW, step=100, generation=3)


def decide(event: Event, ctx: Context):
    return getattr(LADDER, HOOK_NAMES[event.kind])(event, ctx)


FAULTS = [
    crash(),
    Hang(host=3, silent_seconds=5.0, t=NOW, step=100, generation=3),
    CheckpointInvalid(host=3, checkpoint_step=90, reason="nonfinite_loss", t=NOW, step=100, generation=3),
]


@pytest.mark.parametrize("fault", FAULTS, ids=lambda e: e.kind)
@pytest.mark.parametrize(
    ("ctx", "expected"),
    [
        (situation(), RestartInJob()),
        (situation(spares=1), RestartInJob()),
        # Third fault of host 3 within the restart window: a crash loop, the host is replaced.
        (situation(spares=1, faults_of_host={3: [NOW - 60, NOW - 30]}), ReplaceHost(host=3)),
        # ...but only with a spare and replace budget; otherwise restart as usual.
        (situation(faults_of_host={3: [NOW - 60, NOW - 30]}), RestartInJob()),
        (
            situation(spares=1, spent=(Level.REPLACE,), faults_of_host={3: [NOW - 60, NOW - 30]}),
            RestartInJob(),
        ),
        # Faults outside the window, or on other hosts, do not make a loop.
        (situation(spares=1, faults_of_host={3: [NOW - 7200, NOW - 30]}), RestartInJob()),
        (situation(spares=1, faults_of_host={2: [NOW - 60, NOW - 30]}), RestartInJob()),
        # Restart budget spent: replace, else scale down, else fail.
        (situation(spares=1, spent=(Level.RESTART,)), ReplaceHost(host=3)),
        (situation(spent=(Level.RESTART,)), ScaleDown()),
        (situation(spares=1, spent=(Level.RESTART, Level.REPLACE)), ScaleDown()),
    ],
)
def test_a_fault_climbs_the_ladder_cheapest_first(fault, ctx, expected):
    assert decide(fault, ctx) == expected


@pytest.mark.parametrize(
    ("ctx", "words"),
    [
        (
            situation(spent=(Level.RESTART,), min_slices=2),
            [
                "crash on host 3 (exit code 1): restart budget spent (10 of 10 within 3600 s",
                "no spare",
                "already at spec.minSlices=2",
            ],
        ),
        (
            situation(spares=1, spent=(Level.RESTART, Level.REPLACE, Level.SCALE_DOWN)),
            ["restart budget spent", "replace budget is spent", "scale_down budget is spent"],
        ),
    ],
)
def test_a_fault_with_every_rung_spent_fails_naming_what_ran_out(ctx, words):
    action = decide(crash(), ctx)
    assert isinstance(action, Fail)
    for word in words:
        assert word in action.reason


def test_the_crash_loop_threshold_is_a_setting():
    ctx = situation(spares=1, faults_of_host={3: [NOW - 60]})
    assert EscalationLadder(crash_loop_faults=2).on_crash(crash(), ctx) == ReplaceHost(host=3)
    assert LADDER.on_crash(crash(), ctx) == RestartInJob()


LOST = HostLost(host=3, machine="host-3", t=NOW, step=100, generation=3)


@pytest.mark.parametrize(
    ("ctx", "expected"),
    [
        (situation(spares=1), ReplaceHost(host=3)),
        (situation(), ScaleDown()),
        (situation(spares=1, spent=(Level.REPLACE,)), ScaleDown()),
    ],
)
def test_a_lost_host_is_replaced_else_its_slice_is_dropped(ctx, expected):
    assert LADDER.on_host_lost(LOST, ctx) == expected


def test_a_lost_host_with_no_spare_at_the_minimum_fails_with_the_reason():
    action = LADDER.on_host_lost(LOST, situation(min_slices=2))
    assert isinstance(action, Fail)
    assert action.reason == (
        "host 3 lost: cannot replace it (no spare is available) nor scale down (already at spec.minSlices=2)"
    )


def test_a_lost_host_with_both_budgets_spent_fails_naming_them():
    action = LADDER.on_host_lost(LOST, situation(spares=1, spent=(Level.REPLACE, Level.SCALE_DOWN)))
    assert isinstance(action, Fail)
    assert "spec.policy.budgets.replace" in action.reason and "spec.policy.budgets.scaleDown" in action.reason


SLOW = Straggler(host=2, score=2.1, t=NOW, step=100, generation=3)


@pytest.mark.parametrize(
    ("ctx", "expected"),
    [
        (situation(spares=1), ReplaceHost(host=2)),
        (situation(), Ignore()),
        (situation(spares=1, spent=(Level.REPLACE,)), Ignore()),
    ],
)
def test_a_straggler_is_replaced_with_a_spare_and_otherwise_only_reported(ctx, expected):
    assert LADDER.on_straggler(SLOW, ctx) == expected


BACK = CapacityReturned(spares=2, t=NOW, step=100, generation=3)


@pytest.mark.parametrize(
    ("ctx", "expected"),
    [
        (situation(active=(0,), restorable=1), ScaleUp()),
        (situation(active=(0,), restorable=0), Ignore()),
        (situation(restorable=1), Ignore()),  # not scaled down
    ],
)
def test_returned_capacity_scales_back_up_when_a_slice_can_be_restored(ctx, expected):
    assert LADDER.on_capacity_returned(BACK, ctx) == expected


def _every_situation():
    levels = [(), (Level.RESTART,), (Level.REPLACE,), (Level.RESTART, Level.REPLACE, Level.SCALE_DOWN)]
    shapes = [((0, 1), 1, 0), ((0, 1), 2, 0), ((0,), 1, 1), ((0,), 1, 0)]
    loops = [None, {3: [NOW - 60, NOW - 30]}, {2: [NOW - 60, NOW - 30]}]
    for spares, spent, (active, min_slices, restorable), loop in itertools.product(
        (0, 1), levels, shapes, loops
    ):
        yield situation(
            spares=spares,
            spent=spent,
            active=active,
            min_slices=min_slices,
            restorable=restorable,
            faults_of_host=loop,
        )


def test_the_ladder_never_answers_with_an_action_the_engine_would_refuse():
    events = [*FAULTS, LOST, SLOW, BACK, HostLost(host=1, t=NOW, step=100, generation=3)]
    answers = 0
    for ctx in _every_situation():
        for event in events:
            if getattr(event, "host", 0) not in ctx.world.hosts:
                continue  # events only ever concern hosts of the running world
            action = decide(event, ctx)
            assert check_action(event, action, ctx) is None, (event, action, ctx)
            answers += 1
    assert answers > 400  # the loop really covered the grid
