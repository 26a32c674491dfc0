"""The policy API's checks: the actions each kind of event allows (the documented table), and what
`check_action` refuses because it cannot be done now."""

import pytest

from slicekeeper.policy import (
    ALLOWED_ACTIONS,
    ActionName,
    AnnouncedLoss,
    CapacityReturned,
    CheckpointInvalid,
    Crash,
    EventKind,
    Fail,
    Hang,
    HostLost,
    Ignore,
    ReplaceHost,
    RestartInJob,
    ScaleDown,
    ScaleUp,
    Straggler,
    Wait,
    World,
    check_action,
)
from tests.support.policy_contexts import COMMON, context, world

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
    EventKind.ANNOUNCED_LOSS: AnnouncedLoss(host=3, cause="maintenance", seconds_left=60.0, **COMMON),
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
        "announced_loss": {"replace", "scale_down", "ignore", "wait", "fail"},
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
