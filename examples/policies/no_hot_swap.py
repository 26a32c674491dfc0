"""A policy that never hot-swaps: a lost host costs its slice, and the slice comes back with capacity.

Use it when spares are reserved for other jobs, or when a replaced machine would land in a worse
place in the network than the slice it leaves. Run it with:

    slicekeeper run examples/trainingjob.yaml --policy examples/policies/no_hot_swap.py \
        --chaos "lose:host=3@step=40,spare:+1@step=80"
"""

from slicekeeper.policy import (
    Action,
    CapacityReturned,
    Context,
    Fail,
    HostEvent,
    HostLost,
    Ignore,
    RestartInJob,
    ScaleDown,
    ScaleUp,
    Straggler,
)


def on_host_lost(event: HostLost, context: Context) -> Action:
    # ScaleDown() drops the slice that held the lost host; the job goes on with the others.
    if context.can_scale_down([context.world.slice_of(event.host)]):
        return ScaleDown()
    return Fail(reason=f"host {event.host} lost; this policy never hot-swaps and cannot scale down further")


def on_capacity_returned(event: CapacityReturned, context: Context) -> Action:
    # Take the capacity back as soon as a whole slice can be restored.
    return ScaleUp() if context.can_scale_up() else Ignore()


def on_straggler(event: Straggler, context: Context) -> Action:
    # Stragglers are only reported (the report lists them with their scores).
    return Ignore()


def restart_then_scale_down(event: HostEvent, context: Context) -> Action:
    # Crashes, hangs and bad checkpoints: restart while the budget lasts, then give up a slice.
    if context.can_restart():
        return RestartInJob()
    if context.can_scale_down([context.world.slice_of(event.host)]):
        return ScaleDown()
    return Fail(reason=f"{event.summary}: restart budget spent and no slice left to give up")


# One function for the three kinds of fault (names starting with on_ are reserved for hooks).
on_crash = on_hang = on_checkpoint_invalid = restart_then_scale_down
