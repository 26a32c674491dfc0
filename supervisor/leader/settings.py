"""What a leader is told about its job, named once: a frozen `LeaderSettings` read from the spec.

A leader needs a dozen numbers and paths from the job's spec and run folder (the restart budget, the
slices it may drop to, the persistent copies to keep, the peer replicas, the connection deadline,
where the summary and the policy's decisions go). Passed one by one they made a constructor of 17
parameters that every caller (the host's leadership, tests, the control-plane benchmark) spelled out
again; one value, built from the spec in one place (`of_job`), names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slicekeeper.api_spec import TrainingJobSpec
from slicekeeper.shape import JobShape

SUMMARY_FILE = "job-summary.json"
"""The job's summary, in its run folder (written by the leader when the job ends)."""
POLICY_EVENTS_FILE = "policy-events.jsonl"
"""The policy's decisions, in the job's run folder."""


@dataclass(frozen=True)
class LeaderSettings:
    shape: JobShape
    """The job's slices and hosts, as its supervisors run it."""
    max_restarts: int
    """spec.health.maxRestarts: restarts the job may spend."""
    max_restarts_without_progress: int = 3
    """spec.health.maxRestartsWithoutProgress: restarts in a row that trained no step."""
    min_slices: int = 1
    """spec.minSlices: the fewest slices the job may be scaled down to."""
    persistent_keep: int = 2
    """spec.checkpoint.persistent.maxToKeep: the persistent copies kept."""
    peer_replicas: int | None = None
    """spec.checkpoint.peer.replicas (None: every host is told every host's replica address)."""
    connection_deadline: float = 0.0
    """spec.health.connectionDeadlineSeconds, imposed on every member's connection (0: none)."""
    summary_path: Path | None = None
    """Where the job's summary is written when it ends (None: nowhere)."""
    events_path: Path | None = None
    """Where the policy's decisions are written (None: nowhere)."""
    log_events: bool = False
    """Print the job's events (a local run's log)."""

    @classmethod
    def of_job(
        cls, shape: JobShape, spec: TrainingJobSpec, run_dir: Path, *, log_events: bool
    ) -> LeaderSettings:
        """The settings of the job whose spec is `spec`, run in `run_dir`."""
        persistent = spec.checkpoint.persistent
        return cls(
            shape,
            spec.health.max_restarts,
            spec.health.max_restarts_without_progress,
            min_slices=spec.min_slices,
            persistent_keep=persistent.max_to_keep if persistent else 2,
            peer_replicas=spec.checkpoint.peer.replicas,
            connection_deadline=spec.health.connection_deadline_seconds,
            summary_path=run_dir / SUMMARY_FILE,
            events_path=run_dir / POLICY_EVENTS_FILE,
            log_events=log_events,
        )
