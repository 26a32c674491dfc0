"""What each remedy is expected to cost the job's goodput: `context.expected_cost(action, host)`.

A hook that weighs remedies needs their price in one unit: seconds of the whole job's training lost
(a second with every chip idle counts 1, a second with a quarter of them idle 0.25). The leader (and
the fleet simulator) hands the engine `RecoveryCosts`, what its recoveries cost so far or what the
cost model says, and the context prices each action from it:

- RestartInJob: one restart, plus the faults the host is likely to have again: a host with k faults
  in the restart window is expected to fault k more times in the next, each a restart and the steps
  since the last save (half an interval on average).
- ReplaceHost: waiting for a machine (none when a spare stands by) and a restart with one host
  restored from a peer; the host's fault history goes with the old machine.
- ScaleDown: a restart with the smaller world's programs compiled, the dropped slices' share of the
  chips idle until their machines come back, and the restart that scales back up.
- Wait: its seconds; Ignore: nothing now; Fail: infinite.

Part of the policy API (stdlib only): users import `RecoveryCosts` from slicekeeper.policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slicekeeper.policy.actions import (
    Action,
    Fail,
    Ignore,
    Level,
    ReplaceHost,
    RestartInJob,
    ScaleDown,
    ScaleUp,
    Wait,
)
from slicekeeper.policy.codec import fields_from_json, fields_to_json

if TYPE_CHECKING:
    from slicekeeper.policy.context import Context


@dataclass(frozen=True, kw_only=True)
class RecoveryCosts:
    """The prices the expected costs are made of, in seconds."""

    restart_seconds: float
    """A restart in job: the stop-and-start round, distributed init, a local restore, the programs
    loaded (detection is paid already when a decision is made)."""
    swap_seconds: float
    """The same with one host restored from a peer."""
    replace_wait_seconds: float
    """Waiting for a machine before a swap: 0 when a spare stands by, else a new machine's time."""
    compile_seconds: float
    """A world that never ran compiles its programs."""
    capacity_return_seconds: float
    """How long a dropped slice's machines take to come back."""
    lost_work_seconds: float
    """The training a fault throws away on average: half a checkpoint interval."""

    def to_json(self) -> dict[str, Any]:
        return fields_to_json(self)

    @staticmethod
    def from_json(data: Any) -> RecoveryCosts:
        return RecoveryCosts(**fields_from_json(RecoveryCosts, data, "context.costs"))


def expected_cost(action: Action, context: Context, host: int | None = None) -> float:
    """Seconds of the whole job's training `action` is expected to lose, `host` being the host the
    event is about (its faults so far make a restart dearer)."""
    costs = context.costs
    if costs is None:
        raise ValueError("no recovery costs in this context (context.costs is None)")
    if isinstance(action, RestartInJob):
        window = context.budgets[Level.RESTART].window_seconds
        again = context.faults_on(host, window) if host is not None else 0
        return costs.restart_seconds + again * (costs.restart_seconds + costs.lost_work_seconds)
    if isinstance(action, ReplaceHost):
        return costs.replace_wait_seconds + costs.swap_seconds
    if isinstance(action, ScaleDown):
        world = context.world
        dropped = set(action.slices) or ({world.slice_of(host)} if host is not None else set())
        idle = len(dropped) / max(1, len(world.active_slices))
        return 2 * costs.restart_seconds + costs.compile_seconds + idle * costs.capacity_return_seconds
    if isinstance(action, ScaleUp):
        return costs.restart_seconds
    if isinstance(action, Wait):
        return action.seconds
    if isinstance(action, Ignore):
        return 0.0
    if isinstance(action, Fail):
        return math.inf
    raise ValueError(f"no expected cost for {type(action).__name__}")
