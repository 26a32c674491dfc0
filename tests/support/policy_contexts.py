"""The facts a policy decides on, built for the policy API's tests (tests/unit/test_policy_api.py and
test_policy_api_checks.py): a job's world, its budgets and the context a hook is handed.
"""

from __future__ import annotations

from slicekeeper.policy import Budget, Context, Level, World

COMMON = {"t": 1000.0, "step": 40, "generation": 2}


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
