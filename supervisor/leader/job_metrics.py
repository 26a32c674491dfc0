"""The job's own Prometheus series, which only its leader can give, read from the leader at scrape time.

A host's supervisor measures its host (supervisor.metrics); what belongs to the whole job (its state,
its world, the faults and how long each took to recover from, hot-swaps, scale events, stragglers
and their scores) lives in the leader's memory. The supervisor that leads exports it, read from that
memory when scraped, so these are the figures of the report and the TrainingJob's status, never a
second bookkeeping; a supervisor that does not lead exports none of them. The memory goes from
leader to leader with the journal, so the counters carry on across a hand-over (on another target:
dashboards and rules take the job's `max` over its supervisors).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from slicekeeper.supervisor.leader.background import Task
from slicekeeper.supervisor.leader.decisions import Decisions
from slicekeeper.supervisor.leader.journal import JobMemory
from slicekeeper.supervisor.leader.restart_state import JobState
from slicekeeper.supervisor.leader.world import JobWorld

SCALE_KINDS = ("down", "up")
"""The kinds of scale event (supervisor.leader.remediation), counted from 0 so that a rule sees them."""

RECOVERY_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Seconds from a fault's detection until the job trains beyond where it stood."""


class JobView(Protocol):
    """What of a leader these series read (supervisor.leader.Leader)."""

    @property
    def memory(self) -> JobMemory: ...

    @property
    def world(self) -> JobWorld: ...

    @property
    def decisions(self) -> Decisions: ...

    @property
    def task_failures(self) -> Counter[Task]:
        """Background work of this leader that failed, by what it was (leader.background)."""


class JobCollector(Collector):
    """The job's series while `leader()` gives the leader this supervisor runs; none otherwise."""

    def __init__(self, leader: Callable[[], JobView | None]) -> None:
        self._leader = leader

    def collect(self) -> Iterator[Metric]:
        leader = self._leader()
        if leader is None:
            return
        yield from _state(leader.memory)
        yield from _world(leader.world, leader.decisions)
        yield from _faults(leader.memory)
        yield from _stragglers(leader.decisions, leader.world.full_hosts)
        yield _task_failures(leader.task_failures)


def _task_failures(failures: Counter[Task]) -> Metric:
    family = CounterMetricFamily(
        "slicekeeper_leader_task_failures",
        "The leader's background work that failed (each fails the job with the reason), by what it was.",
        labels=["task"],
    )
    for task in Task:  # every task from 0: a rule sees the first failure
        family.add_metric([task.value], failures[task])
    return family


def _state(memory: JobMemory) -> Iterator[Metric]:
    state = GaugeMetricFamily(
        "slicekeeper_job_state", "1 for the job's current state, 0 for the others.", labels=["state"]
    )
    for each in JobState:
        state.add_metric([each.value], 1.0 if memory.state is each else 0.0)
    yield state
    step = GaugeMetricFamily("slicekeeper_job_step", "The furthest step the job completed.")
    step.add_metric([], memory.high_water)
    yield step
    generation = GaugeMetricFamily("slicekeeper_job_generation", "The job's restart generation.")
    generation.add_metric([], memory.generation)
    yield generation
    restarts = CounterMetricFamily(
        "slicekeeper_job_restarts",
        "Stops of the whole job, by the kind of fault or planned change that caused them.",
        labels=["kind"],
    )
    for kind, count in sorted(memory.restarts.items()):
        restarts.add_metric([kind], count)
    yield restarts
    hot_swaps = CounterMetricFamily(
        "slicekeeper_job_hot_swaps", "Hosts replaced by a spare or a new pod, restored from a peer or tier."
    )
    hot_swaps.add_metric([], len(memory.hot_swaps))
    yield hot_swaps
    changes = CounterMetricFamily("slicekeeper_job_leader_changes", "Hand-overs to a new leader.")
    changes.add_metric([], len(memory.leader_changes))
    yield changes


def _full_and_active(what: str, full: int, active: int) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        f"slicekeeper_job_{what}",
        f"The job's {what}: `full` as written, `active` taking part now (fewer while scaled down).",
        labels=["state"],
    )
    family.add_metric(["full"], full)
    family.add_metric(["active"], active)
    return family


def _world(world: JobWorld, decisions: Decisions) -> Iterator[Metric]:
    per_host = world.shape.devices_per_host  # devices: TPU chips in a cluster, CPU devices locally
    yield _full_and_active("slices", world.shape.slices, len(world.active))
    yield _full_and_active("hosts", world.full_hosts, len(world.hosts))
    yield _full_and_active("devices", world.full_hosts * per_host, len(world.hosts) * per_host)
    scale = CounterMetricFamily(
        "slicekeeper_job_scale_events", "Elastic scale events, by kind (down, up).", labels=["kind"]
    )
    counts = Counter(event["kind"] for event in decisions.scale_events)
    for kind in sorted({*SCALE_KINDS, *counts}):
        scale.add_metric([kind], counts[kind])
    yield scale


def _faults(memory: JobMemory) -> Iterator[Metric]:
    detections = CounterMetricFamily(
        "slicekeeper_job_detections",
        "Faults the supervisors detected, by kind (crash, hang, lost host, ...).",
        labels=["kind"],
    )
    for kind, count in sorted(Counter(d.kind for d in memory.detections).items()):
        detections.add_metric([kind], count)
    yield detections
    recovery = HistogramMetricFamily(
        "slicekeeper_job_recovery_seconds",
        "Per recovered fault, by kind: seconds from its detection until the job trained beyond where "
        "it stood (the report's detected -> productive).",
        labels=["kind"],
    )
    times: dict[str, list[float]] = {}
    for record in memory.faults:
        if record.detected_at is not None and record.productive_at is not None:
            times.setdefault(record.kind, []).append(record.productive_at - record.detected_at)
    for chaos_kind, seconds in sorted(times.items()):
        buckets = [(str(bound), float(sum(1 for s in seconds if s <= bound))) for bound in RECOVERY_BUCKETS]
        recovery.add_metric([chaos_kind], [*buckets, ("+Inf", float(len(seconds)))], sum(seconds))
    yield recovery


def _stragglers(decisions: Decisions, host_count: int) -> Iterator[Metric]:
    score = GaugeMetricFamily(
        "slicekeeper_straggler_score",
        "Per host: its own work per step over the other hosts' (medians over the detector's window; "
        "1 is normal, 2 twice as slow; supervisor/signals/straggler.py).",
        labels=["host"],
    )
    for host, value in sorted(decisions.detector.scores().items()):
        score.add_metric([str(host)], value)
    yield score
    flagged = GaugeMetricFamily(
        "slicekeeper_straggler_flagged",
        "1 for a host found straggling since the world last changed, else 0.",
        labels=["host"],
    )
    now_flagged = decisions.detector.flagged
    for host in sorted(decisions.detector.scores()):
        flagged.add_metric([str(host)], 1.0 if host in now_flagged else 0.0)
    yield flagged
    found = CounterMetricFamily(
        "slicekeeper_job_stragglers",
        "Straggler findings, by the host found slow (every host of the job, from 0).",
        labels=["host"],
    )
    counts = Counter(int(s["host"]) for s in decisions.stragglers)
    for host in sorted({*range(host_count), *counts}):
        found.add_metric([str(host)], counts[host])
    yield found
