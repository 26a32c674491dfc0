"""A simulated failure as the policy events the real leader would decide it as.

The leader turns what it detects into `slicekeeper.policy` events (a crash, a hang with the host it
was put down to, a lost machine, a checkpoint found invalid, an announced loss); the simulator does the
same from a failure of the schedule, so the user's policy is asked exactly what it is asked in a run.
A whole slice's failure is one event per host, as the leader sees each of its members go.
"""

from __future__ import annotations

from slicekeeper.supervisor.fleet.failures import Effect, Failure

from slicekeeper import policy

NOTICE_SECONDS = 3600.0
"""An announced maintenance's notice as the policy sees it (GKE labels a node ahead of the event)."""


def policy_events(
    failure: Failure, hosts: list[int], *, t: float, step: int, generation: int, hang_seconds: float
) -> list[policy.Event]:
    """The events `failure` on `hosts` is decided as, at time `t` (Unix), step and generation."""
    effect, name = failure.category.effect, failure.category.name
    if effect is Effect.CRASH:
        return [policy.Crash(t=t, step=step, generation=generation, host=hosts[0], exit_code=1, detail=name)]
    if effect is Effect.HANG:
        return [
            policy.Hang(t=t, step=step, generation=generation, host=hosts[0], silent_seconds=hang_seconds)
        ]
    if effect is Effect.CORRUPT:
        return [
            policy.CheckpointInvalid(
                t=t,
                step=step,
                generation=generation,
                host=hosts[0],
                reason="nonfinite_loss",
                checkpoint_step=step,
            )
        ]
    if effect is Effect.MAINTENANCE:
        return [
            policy.AnnouncedLoss(
                t=t,
                step=step,
                generation=generation,
                host=h,
                cause="maintenance",
                seconds_left=NOTICE_SECONDS,
                saved_step=step,
            )
            for h in hosts
        ]
    return [
        policy.HostLost(t=t, step=step, generation=generation, host=h, machine=f"machine-{h}") for h in hosts
    ]
