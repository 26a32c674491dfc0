"""Fail fast: stop the job after 3 faults within 10 minutes, of any kind on any host.

For runs where a person should look before more TPU time is spent. Every other decision is the
default escalation ladder's: the catch-all hook `on_event` receives every event kind that has no
hook of its own here, and hands it to the ladder.
"""

from slicekeeper.policy import FAULT_KINDS, HOOK_NAMES, Action, Context, Event, Fail
from slicekeeper.policy.default import EscalationLadder

MAX_FAULTS = 3
WINDOW_SECONDS = 600
LADDER = EscalationLadder()


def on_event(event: Event, context: Context) -> Action:
    if event.kind in FAULT_KINDS:
        recent = len(context.faults(within_seconds=WINDOW_SECONDS)) + 1  # + the event being decided
        if recent >= MAX_FAULTS:
            return Fail(reason=f"{recent} faults within {WINDOW_SECONDS} s (last: {event.summary})")
    # The ladder has one method per event kind, named like the hooks.
    hook = getattr(LADDER, HOOK_NAMES[event.kind])
    return hook(event, context)
