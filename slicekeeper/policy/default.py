"""The default policy: DESIGN.md's escalation ladder, written with the same API a user's policy uses.

Cheapest remedy first, each rung with its own budget (slicekeeper.policy.Level): restart in job, then
replace the host with a spare (hot-swap), then scale down by whole slices, then fail with a reason
that names what ran out. It never answers with an action whose budget is spent or that cannot be
carried out now, so the engine's checks pass on every answer it gives. It also decides for every
hook a user's policy leaves out, and whenever a user's hook fails.
"""

from __future__ import annotations

from dataclasses import dataclass

from slicekeeper.policy import (
    Action,
    AnnouncedLoss,
    CapacityReturned,
    CheckpointInvalid,
    Context,
    Crash,
    Fail,
    Hang,
    HostEvent,
    HostLost,
    Ignore,
    Level,
    ReplaceHost,
    RestartInJob,
    ScaleDown,
    ScaleUp,
    Straggler,
    check_action,
)

CRASH_LOOP_FAULTS = 3
"""Faults of one host within the restart window that make it a crash loop (the host, not the job)."""


@dataclass(frozen=True, kw_only=True)
class EscalationLadder:
    """The ladder as hooks. Tables of its answers are in docs/policy.md ("The default policy")."""

    crash_loop_faults: int = CRASH_LOOP_FAULTS

    def on_crash(self, event: Crash, context: Context) -> Action:
        return self._fault(event, context)

    def on_hang(self, event: Hang, context: Context) -> Action:
        return self._fault(event, context)

    def on_checkpoint_invalid(self, event: CheckpointInvalid, context: Context) -> Action:
        return self._fault(event, context)

    def on_host_lost(self, event: HostLost, context: Context) -> Action:
        options = _replace_or_scale_down(event, context)
        if options:
            return _cheapest(options, context, event.host)
        return Fail(
            reason=f"host {event.host} lost: cannot replace it ({_why_not_replace(event, context)}) "
            f"nor scale down ({_why_not_scale_down(event, context)})"
        )

    def on_straggler(self, event: Straggler, context: Context) -> Action:
        # A slow host still trains: replacing it is worth a spare, never a scale-down or a failure.
        if context.can_replace(event.host):
            return ReplaceHost(host=event.host)
        return Ignore()

    def on_announced_loss(self, event: AnnouncedLoss, context: Context) -> Action:
        # The machine goes soon: hand its host to a spare now, from the step saved on the notice,
        # rather than lose it later (the same as a lost host, but ahead of time); with no spare and
        # no slice to spare, the job trains on until the loss comes. Where the costs are known, the
        # cheaper of the two (a scale-down beats waiting minutes for a machine when a slice is a
        # small share of the job).
        options = _replace_or_scale_down(event, context)
        return _cheapest(options, context, event.host) if options else Ignore()

    def on_capacity_returned(self, event: CapacityReturned, context: Context) -> Action:
        return ScaleUp() if context.can_scale_up() else Ignore()

    def _fault(self, event: Crash | Hang | CheckpointInvalid, context: Context) -> Action:
        """A fault that stopped the job: restart, or replace a crash-looping host, or escalate."""
        host = event.host
        window = context.budgets[Level.RESTART].window_seconds
        # The event being decided counts too: the third fault in the window is the loop.
        crash_loop = context.faults_on(host, window) + 1 >= self.crash_loop_faults
        if crash_loop and context.can_replace(host):
            return ReplaceHost(host=host)
        if context.can_restart():
            # A host that faulted before is likely to again: where a swap is expected to cost less
            # than restarting it (and its next faults), it goes before the crash loop. A first fault
            # is restarted: a spare is not spent on a host with no record.
            if context.faults_on(host, window) and context.can_replace(host):
                return _cheapest([RestartInJob(), ReplaceHost(host=host)], context, host)
            return RestartInJob()
        if context.can_replace(host):
            return ReplaceHost(host=host)
        if context.can_scale_down([context.world.slice_of(host)]):
            return ScaleDown()
        restart = context.budgets[Level.RESTART]
        return Fail(
            reason=f"{event.summary}: restart budget spent ({restart.used} of {restart.limit} within "
            f"{restart.window_seconds:g} s, spec.policy.budgets.restart); cannot replace the host "
            f"({_why_not_replace(event, context)}) nor scale down ({_why_not_scale_down(event, context)})"
        )


def _replace_or_scale_down(event: HostEvent, context: Context) -> list[Action]:
    """The remedies for a host whose machine is gone or going, in the ladder's order."""
    options: list[Action] = []
    if context.can_replace(event.host):
        options.append(ReplaceHost(host=event.host))
    if context.can_scale_down([context.world.slice_of(event.host)]):
        options.append(ScaleDown())
    return options


def _cheapest(options: list[Action], context: Context, host: int) -> Action:
    """The option expected to cost the least (the first on a tie); the first where costs are unknown."""
    if context.costs is None:
        return options[0]
    return min(options, key=lambda action: context.expected_cost(action, host) or 0.0)


def _why_not_replace(event: HostEvent, context: Context) -> str:
    return check_action(event, ReplaceHost(host=event.host), context) or "possible"


def _why_not_scale_down(event: HostEvent, context: Context) -> str:
    problem = check_action(event, ScaleDown(), context) or "possible"
    if "minSlices" in problem:
        return f"already at spec.minSlices={context.world.min_slices}"
    return problem
