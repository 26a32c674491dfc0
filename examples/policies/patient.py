"""A patient policy: restart more before blaming a host, and wait a while for a spare before shrinking.

Compared with the default escalation ladder: a host must fault 5 times (not 3) within half an hour
before it is replaced, and a lost host with no spare ready holds the job for up to two minutes in
case one comes back (a preempted VM that is recreated) before the job scales down. Events this file
has no hook for (stragglers, bad checkpoints, capacity returning) get the default policy's answer.
"""

from slicekeeper.policy import (
    Action,
    Context,
    Crash,
    Fail,
    Hang,
    HostLost,
    ReplaceHost,
    RestartInJob,
    ScaleDown,
    Wait,
)

CRASH_LOOP_FAULTS = 5
CRASH_LOOP_WINDOW_SECONDS = 1800
SPARE_PATIENCE_SECONDS = 120
POLL_SECONDS = 10


def on_host_lost(event: HostLost, context: Context) -> Action:
    if context.can_replace(event.host):
        return ReplaceHost(host=event.host)
    # A Wait offers the same loss again after POLL_SECONDS, with a fresh context (spares counted
    # anew); waited_seconds says how long this loss has been put off so far.
    if context.waited_seconds(event) < SPARE_PATIENCE_SECONDS:
        return Wait(seconds=POLL_SECONDS)
    if context.can_scale_down([context.world.slice_of(event.host)]):
        return ScaleDown()
    return Fail(
        reason=f"host {event.host} lost, no spare within {SPARE_PATIENCE_SECONDS} s, cannot scale down"
    )


def on_crash(event: Crash | Hang, context: Context) -> Action:
    faults = context.faults_on(event.host, within_seconds=CRASH_LOOP_WINDOW_SECONDS) + 1  # + this one
    if faults >= CRASH_LOOP_FAULTS and context.can_replace(event.host):
        return ReplaceHost(host=event.host)
    if context.can_restart():
        return RestartInJob()
    if context.can_replace(event.host):
        return ReplaceHost(host=event.host)
    if context.can_scale_down([context.world.slice_of(event.host)]):
        return ScaleDown()
    return Fail(reason=f"{event.summary}: every budget is spent (docs/policy.md, Budgets)")


on_hang = on_crash
