"""The policy API: what a user's policy file imports to decide what happens on each fault.

A policy is a set of hooks, `on_crash(event, context) -> Action` and so on, one per event kind. A
policy file writes `from slicekeeper.policy import ...` and finds here everything a hook sees and
returns, as frozen data: the events (a fault or a change of capacity, .events), the actions with the
table of which actions each event allows (.actions), and the read-only context (history, budgets,
spares, scores, the current world) with the check of an answer (.context). The engine
(slicekeeper.policy.engine) calls the hooks, checks their answers with `check_action` and falls back
to the default policy (slicekeeper.policy.default) when a hook fails; the leader applies the action.

This package's `__init__` re-exports only that API and stays stdlib only: a policy file must import it
in any process, without jax or the supervisor. It never imports the engine, replay or the default
ladder: those import this package (a cycle otherwise), and a policy file needs none of them.
"""

from __future__ import annotations

from slicekeeper.policy.actions import (
    ACTION_TYPES,
    ALLOWED_ACTIONS,
    Action,
    ActionName,
    Fail,
    Ignore,
    Level,
    ReplaceHost,
    RestartInJob,
    ScaleDown,
    ScaleUp,
    Wait,
)
from slicekeeper.policy.context import (
    HOOK_NAMES,
    Budget,
    Context,
    Decision,
    DecisionSource,
    Policy,
    World,
    check_action,
)
from slicekeeper.policy.costs import RecoveryCosts
from slicekeeper.policy.events import (
    EVENT_TYPES,
    FAULT_KINDS,
    AnnouncedLoss,
    CapacityReturned,
    CheckpointInvalid,
    Crash,
    Event,
    EventKind,
    Hang,
    HostEvent,
    HostLost,
    Straggler,
)

__all__ = [
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
]
