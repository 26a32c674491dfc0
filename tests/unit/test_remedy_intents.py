"""What a policy decision comes to (supervisor.leader.remedies): the steps, in order, per action and
per state of the job, as a table."""

from __future__ import annotations

import pytest
from slicekeeper.supervisor.leader.remedies import HoldFor, StopFirst, intents
from slicekeeper.supervisor.leader.restart_state import JobState

from slicekeeper import policy

CRASH = policy.Crash(t=1.0, step=10, generation=2, host=3)
CAPACITY = policy.CapacityReturned(t=1.0, step=10, generation=2, spares=2)
REPLACE = policy.ReplaceHost(host=3)
DOWN = policy.ScaleDown(slices=(1,))
UP = policy.ScaleUp()


@pytest.mark.parametrize(
    ("event", "action", "phase", "steps"),
    [
        # the stop under way is the restart; an ignored event needs nothing
        (CRASH, policy.RestartInJob(), JobState.STOPPING, ()),
        (CRASH, policy.Ignore(), JobState.RUNNING, ()),
        (CRASH, policy.Fail(reason="no"), JobState.STOPPING, (policy.Fail(reason="no"),)),
        # a Wait holds the start only when the job is stopped
        (CRASH, policy.Wait(seconds=5.0), JobState.STOPPING, (HoldFor(5.0, holds=True),)),
        (CAPACITY, policy.Wait(seconds=5.0), JobState.RUNNING, (HoldFor(5.0, holds=False),)),
        # the world changes while the job is stopped: stopped first when it runs
        (CRASH, REPLACE, JobState.STOPPING, (REPLACE,)),
        (CRASH, REPLACE, JobState.RUNNING, (StopFirst(3, "crash", "replace", planned=False), REPLACE)),
        (CRASH, DOWN, JobState.RUNNING, (StopFirst(3, "crash", "scale_down", planned=False), DOWN)),
        # a scale-up is a planned stop (nothing broke), of no host in particular
        (CAPACITY, UP, JobState.RUNNING, (StopFirst(0, "capacity_returned", "scale_up", planned=True), UP)),
        # an ended job does nothing more
        (CRASH, REPLACE, JobState.FAILED, ()),
        (CRASH, policy.Fail(reason="no"), JobState.SUCCEEDED, ()),
    ],
)
def test_each_action_comes_to_its_steps_in_order(event, action, phase, steps):
    assert intents(event, action, phase) == steps
