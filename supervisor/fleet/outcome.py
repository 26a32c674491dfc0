"""What a simulated run is of and what it came to: the job as the simulator sees it (`Job`), the
strategy it is run with (`Mode`), the whole of a run's options (`Setup`), and the outcome (`Result`):
chip-seconds by goodput category, the decisions, the recoveries, and the records a run's report is
made of (supervisor.fleet.report_file).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from slicekeeper.supervisor.fleet.costs import CostModel
from slicekeeper.supervisor.leader.restart_rule import RestartRule

from slicekeeper.goodput import Category
from slicekeeper.policy import Context, Decision
from slicekeeper.policy.engine import PolicyEngine
from slicekeeper.policy.replay import log_record
from slicekeeper.shape import JobShape


class Mode(StrEnum):
    SLICEKEEPER = "slicekeeper"
    """The product: in-job restarts from the local tier, hot-swaps from the peer tier, the policy."""
    PERSISTENT_RESTART = "restart from persistent"
    """What most jobs do today: every pod recreated, every host restored from the persistent tier, a
    lost machine waited for."""


@dataclass(frozen=True)
class Job:
    shape: JobShape
    min_slices: int
    interval: int
    """Steps between local saves (spec.checkpoint.interval)."""
    persistent_interval: int
    """Steps between persistent saves (the restart-from-persistent baseline's checkpoints)."""
    spares: int
    rule: RestartRule
    new_machines: bool = True
    """In a cluster a lost host gets a new machine (later) even with no spare standing by, and a
    dropped slice's machines come back; a local run (a replay) has only its spares."""

    @property
    def chips(self) -> int:
        return self.shape.host_count * self.shape.devices_per_host


@dataclass(frozen=True)
class Setup:
    """What a run simulates and how: the job, the costs, the policy and the strategy."""

    job: Job
    costs: CostModel
    engine: PolicyEngine | None
    """The policy asked at every event (None: the restart-from-persistent baseline asks none)."""
    mode: Mode = Mode.SLICEKEEPER
    name: str = "slicekeeper"
    step_seconds_by_slices: Mapping[int, float] = field(default_factory=dict)
    """A world's step time where it differs from the cost model's (a replay measures each world's:
    on one machine fewer hosts share its cores)."""
    priced: bool = True
    """The policy is told what each remedy costs (context.expected_cost); False: the plain ladder."""
    keep_records: bool = False
    """Keep what a report lists: every decision with its context (the policy event log beside it),
    the worlds and the scale events with their slices."""

    @property
    def interval(self) -> int:
        """Steps between the saves a restart restores from: local ones, or persistent ones for the
        baseline."""
        return self.job.interval if self.mode is Mode.SLICEKEEPER else self.job.persistent_interval


@dataclass
class Result:
    name: str
    seconds: float
    chips: int
    chip_seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    decisions: Counter[str] = field(default_factory=Counter)
    recoveries: dict[str, list[float]] = field(default_factory=dict)
    """Fault kind -> seconds from each failure to training again."""
    failures: int = 0
    failure_reason: str | None = None
    steps: float = 0.0
    """Steps done at the end."""
    generations: int = 1
    restarts: Counter[str] = field(default_factory=Counter)
    """Fault kind -> the restarts it caused (the report's `restarts`)."""
    faults: list[dict[str, Any]] = field(default_factory=list)
    """Each failure as the report lists a fault: when it came, was detected, training went on."""
    keep_records: bool = False
    decision_log: list[dict[str, Any]] = field(default_factory=list)
    """Each decision with its context, as the leader's policy event log has them (with `keep_records`
    only, as the worlds and scale events: each holds the world's slices, 12,500 at 100,000 chips)."""
    decision_records: list[dict[str, Any]] = field(default_factory=list)
    """Each decision as the report lists it."""
    worlds: list[dict[str, Any]] = field(default_factory=list)
    scale_events: list[dict[str, Any]] = field(default_factory=list)
    hot_swaps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def goodput(self) -> float:
        return self.chip_seconds[Category.PRODUCTIVE] / (self.chips * self.seconds)

    def badput_seconds(self, digits: int = 1) -> dict[str, float]:
        """Each category's chip-seconds as seconds of the whole job (they add up with the productive
        time to the simulated span)."""
        return {
            c: round(v / self.chips, digits)
            for c, v in sorted(self.chip_seconds.items())
            if c != Category.PRODUCTIVE and v > 0
        }

    def decided(self, decision: Decision, context: Context, *, step: int, generation: int) -> None:
        self.decisions[decision.action.name] += 1
        if self.keep_records:
            self.decision_log.append(log_record(decision, context))
        self.decision_records.append(
            {
                "t": decision.t,
                "step": step,
                "generation": generation,
                "event": decision.event.to_json(),
                "action": decision.action.to_json(),
                "source": decision.source.value,
                "reason": decision.reason,
            }
        )

    def mean_recovery(self) -> dict[str, float]:
        return {k: round(sum(v) / len(v), 1) for k, v in sorted(self.recoveries.items()) if v}
