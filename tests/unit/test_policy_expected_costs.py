"""`context.expected_cost(action, host)` and the default ladder that weighs remedies by it: a host that
faulted before is swapped at its second fault when a spare stands by, a lost host with no spare is
answered by the cheaper of waiting for a machine and dropping its slice. Without costs in the context
(the negative control) the ladder answers as it always did."""

from __future__ import annotations

import dataclasses
import math

import pytest

from slicekeeper.policy import (
    Context,
    Crash,
    Decision,
    DecisionSource,
    Fail,
    HostLost,
    Ignore,
    RecoveryCosts,
    ReplaceHost,
    RestartInJob,
    ScaleDown,
    Wait,
)
from slicekeeper.policy.default import EscalationLadder
from tests.support.policy_contexts import COMMON, context, world

COSTS = RecoveryCosts(
    restart_seconds=10.0,
    swap_seconds=12.0,
    replace_wait_seconds=0.0,
    compile_seconds=15.0,
    capacity_return_seconds=300.0,
    lost_work_seconds=25.0,
)


def priced(base: Context, **changes: float) -> Context:
    return dataclasses.replace(base, costs=dataclasses.replace(COSTS, **changes))


def crashed_before(host: int, t: float = 900.0) -> Decision:
    event = Crash(t=t, step=30, generation=1, host=host, exit_code=1)
    return Decision(event=event, action=RestartInJob(), source=DecisionSource.DEFAULT, reason="", t=t)


def test_without_costs_there_is_no_expected_cost():
    assert context().expected_cost(RestartInJob()) is None


def test_each_remedy_is_priced_in_seconds_of_the_whole_job():
    fresh = priced(context())
    assert fresh.expected_cost(RestartInJob(), host=1) == 10.0
    assert fresh.expected_cost(ReplaceHost(host=1)) == 12.0
    # Two restarts, a compile and half the job idle until its machines come back.
    assert fresh.expected_cost(ScaleDown(), host=1) == 2 * 10.0 + 15.0 + 0.5 * 300.0
    assert fresh.expected_cost(Wait(seconds=7.0)) == 7.0
    assert fresh.expected_cost(Ignore()) == 0.0
    assert fresh.expected_cost(Fail(reason="x")) == math.inf
    again = priced(context(history=(crashed_before(1),)))
    assert again.expected_cost(RestartInJob(), host=1) == 10.0 + (10.0 + 25.0)  # it is likely again
    assert again.expected_cost(RestartInJob(), host=0) == 10.0
    waiting = priced(context(), replace_wait_seconds=300.0)
    assert waiting.expected_cost(ReplaceHost(host=1)) == 312.0


def test_the_costs_travel_with_the_context_in_the_event_log():
    original = priced(context())
    assert Context.from_json(original.to_json()).costs == original.costs
    assert Context.from_json(context().to_json()).costs is None


def test_the_ladder_swaps_a_host_at_its_second_fault_when_that_is_cheaper():
    ladder = EscalationLadder()
    crash = Crash(**COMMON, host=1, exit_code=1)
    history = (crashed_before(1),)
    assert ladder.on_crash(crash, priced(context(history=history))) == ReplaceHost(host=1)
    assert ladder.on_crash(crash, context(history=history)) == RestartInJob()  # unpriced: as before
    assert ladder.on_crash(crash, priced(context())) == RestartInJob()  # a first fault: restart
    slow_swap = priced(context(history=history), replace_wait_seconds=300.0)
    assert ladder.on_crash(crash, slow_swap) == RestartInJob()  # a machine to wait for: restart


@pytest.mark.parametrize(
    ("slices", "wait", "expected"),
    [
        (64, 300.0, ScaleDown()),  # one slice of 64 idles: far cheaper than stopping for 5 minutes
        (2, 300.0, ScaleDown()),  # half the job for 5 minutes still beats all of it
        (2, 30.0, ReplaceHost(host=1)),  # a machine in 30 s: wait for it
    ],
)
def test_a_lost_host_gets_the_cheaper_of_waiting_for_a_machine_and_dropping_its_slice(slices, wait, expected):
    the_world = world(active=tuple(range(slices)), full=slices)
    base = context(the_world=the_world)
    lost = HostLost(**COMMON, host=1, machine="m-1")
    answer = EscalationLadder().on_host_lost(lost, priced(base, replace_wait_seconds=wait))
    assert answer == expected
    assert EscalationLadder().on_host_lost(lost, base) == ReplaceHost(host=1)  # unpriced: as before
