"""What a policy decision comes to, as data: `intents(event, action, phase)`, pure and table-tested.

The policy answers an event with one action (slicekeeper.policy.actions). Carrying it out may take
more than one step: a hot-swap or a scale event decided while the job runs stops it first (the stop
is the restart that lets the world change), a `Wait` holds a stopped job until it is reconsidered.
This module says which steps, in order; leader.remediation looks up one applier per step by its type
and carries them out. No asyncio, sockets, files or clocks in here.
"""

from __future__ import annotations

from dataclasses import dataclass

from slicekeeper.supervisor.leader.restart_state import JobState

from slicekeeper import policy
from slicekeeper.policy.events import FaultKind


@dataclass(frozen=True)
class StopFirst:
    """Stop the running generation before the world changes (`planned`: nothing broke: a scale-up)."""

    host: int
    kind: FaultKind
    detail: str
    planned: bool


@dataclass(frozen=True)
class HoldFor:
    """A policy's `Wait`: decide on the same event again in `seconds`; `holds`: the job stays stopped
    until then (it was stopping when the decision came)."""

    seconds: float
    holds: bool


Intent = StopFirst | HoldFor | policy.Fail | policy.ReplaceHost | policy.ScaleDown | policy.ScaleUp

WORLD_CHANGES = (policy.ReplaceHost, policy.ScaleDown, policy.ScaleUp)
"""The actions that change who takes part: applied while the job is stopped."""


def intents(event: policy.Event, action: policy.Action, phase: JobState) -> tuple[Intent, ...]:
    """The steps that carry out `action`, decided on `event`, with the job in `phase`."""
    if phase in (JobState.SUCCEEDED, JobState.FAILED):
        return ()
    if isinstance(action, policy.Fail):
        return (action,)
    if isinstance(action, policy.Wait):
        return (HoldFor(action.seconds, holds=phase is JobState.STOPPING),)
    if isinstance(action, WORLD_CHANGES):
        if phase is not JobState.RUNNING:
            return (action,)
        host = event.host if isinstance(event, policy.HostEvent) else 0
        stop = StopFirst(
            host, FaultKind(event.kind), str(action.name), planned=isinstance(action, policy.ScaleUp)
        )
        return (stop, action)
    return ()  # RestartInJob: the stop under way is the restart; Ignore: nothing to do
