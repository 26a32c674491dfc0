"""When a fault may restart the job, and when it fails it instead: the one rule, stated here.

Every fault that stops the job restarts it (whatever the policy then orders: a restart in place, a
hot-swap and a scale-down all start a new generation), so two job-wide limits apply to every stop,
checked before the policy is asked:

- `spec.health.maxRestartsWithoutProgress` consecutive starts that never completed a step fail the
  job (a workload that cannot start at all);
- `spec.health.maxRestarts` stops of any kind fail the job at the next fault (the job-wide cap).

A stop the policy planned with nothing broken (a scale-up) is under neither: it costs no restart.
Within those caps the policy's own budgets (`spec.policy.budgets`: restart, replace, scaleDown, each
a number of uses within a time window) bound each remedy; the policy context refuses an action whose
budget is spent (slicekeeper.policy.context.check_action). Both kinds of count live in the job's
memory and its journal, so a new leader carries them on: killing the leader never resets a budget.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RestartRule:
    max_restarts: int
    """spec.health.maxRestarts."""
    max_without_progress: int = 3
    """spec.health.maxRestartsWithoutProgress."""

    @staticmethod
    def without_progress(count: int, progressed: bool, planned: bool) -> int:
        """The consecutive starts without progress once the running generation stops (`count`: before
        it; `progressed`: it completed a step; `planned`: nothing broke)."""
        return 0 if progressed or planned else count + 1

    def refusal(self, without_progress: int, restarts: int, fault: str) -> str | None:
        """Why a fault (`fault`: e.g. "crash on host 2 (workload exited with 1)") fails the job instead
        of restarting it; None when it may restart. `without_progress`: as `without_progress` counted
        it with this stop; `restarts`: the restarts before this one."""
        if without_progress >= self.max_without_progress:
            return (
                f"no progress across {without_progress} consecutive starts "
                f"(spec.health.maxRestartsWithoutProgress); last fault: {fault}"
            )
        if restarts >= self.max_restarts:
            return (
                f"restart budget spent: {self.max_restarts} in-job restarts (spec.health.maxRestarts); "
                f"last fault: {fault}"
            )
        return None
