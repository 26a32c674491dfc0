"""A host's bookkeeping of its generation's steps (supervisor/host/sdk_effects.py, StepBookkeeping):
the first step of a start, the end at which the next standby is due, and the sanity checks right
after a restore, as pure transitions without a clock or a socket."""

from __future__ import annotations

import math

import pytest
from slicekeeper.supervisor.host.sdk_effects import SANITY_STEPS, StepBookkeeping


def test_only_the_first_step_of_a_start_is_its_first():
    steps = StepBookkeeping()
    steps.begin(None, 0)
    assert steps.first_pending
    steps.ended(1)
    assert not steps.first_pending
    steps.begin(1, 5)  # a restart: the first step to come again
    assert steps.first_pending


def test_the_standby_is_due_once_after_the_first_step_beyond_what_the_host_had_done():
    steps = StepBookkeeping()
    steps.begin(35, 40)  # restored 35, had reached 40: steps 36-40 are done again
    assert [step for step in range(36, 45) if steps.ended(step)] == [41]
    steps.begin(None, 0)
    assert [step for step in range(1, 4) if steps.ended(step)] == [1]


@pytest.mark.parametrize(
    ("losses", "condemned_at"),
    [
        ([1.0, 2.0, 3.0, math.nan], None),  # the first SANITY_STEPS were finite: no later one is checked
        ([1.0, math.inf], 1),
        ([None, -math.inf], 1),  # a step without a loss passes its check
        ([math.nan, math.nan], 0),  # condemned once: no later check
    ],
    ids=["finite-then-unchecked", "infinite", "no-loss-then-infinite", "condemned-once"],
)
def test_a_loss_that_is_not_finite_right_after_a_restore_condemns_the_restored_step(losses, condemned_at):
    assert SANITY_STEPS == 3
    steps = StepBookkeeping()
    steps.begin(7, 7)
    steps.check_restored()
    condemned = [i for i, loss in enumerate(losses) if steps.condemns(loss)]
    assert condemned == ([] if condemned_at is None else [condemned_at])
    assert steps.restored_step == 7


def test_without_a_staged_restore_no_loss_is_checked():
    steps = StepBookkeeping()
    steps.begin(None, 0)
    assert not steps.condemns(math.nan)
    steps.check_restored()
    steps.begin(3, 3)  # a new start forgets the checks of the last
    assert not steps.condemns(math.nan)
