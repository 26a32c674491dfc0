"""What the parts of a host supervisor's checkpoint tiers share (supervisor.checkpoints.tiers): the
machine's disk and its tiers with where they say what happened (`TierContext`, fixed for the
supervisor's life), and whom the machine serves now (`Serving`, changed at a claim and at each
generation).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from slicekeeper.supervisor.checkpoint_vocabulary import Tier
from slicekeeper.supervisor.checkpoints.peer_tier import ReplicaStore
from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTier
from slicekeeper.supervisor.metrics import SupervisorMetrics
from slicekeeper.supervisor.reporting import Log, Report
from slicekeeper.supervisor.tls import JobTls

from slicekeeper.api import CheckpointSpec
from slicekeeper.shape import JobShape


@dataclass(frozen=True)
class TierContext:
    disk: Path
    """The machine's disk: `local/` and `peers/` below it; a lost machine loses both."""
    local_dir: Path
    """The local tier, the only one the workload writes and reads."""
    replicas: ReplicaStore
    """The replicas this machine keeps for other hosts."""
    persistent: PersistentTier | None
    spec: CheckpointSpec
    shape: JobShape
    metrics: SupervisorMetrics
    report: Report
    log: Log
    tls: JobTls | None
    """The job's credentials for the peer tier's connections (None: plain TCP)."""
    connection_deadline: float
    """The peer tier's connections' seconds of silence before they end (0: none)."""

    def warn(self, host: int | None, kind: str, step: int, tier: Tier, detail: str, text: str) -> None:
        """A copy or restore source that did not work: into the event log and onto stderr."""
        self.log({"source": "supervisor", "type": kind, "step": step, "tier": tier.value, "detail": detail})
        print(f"[host {host}] {text}: {detail}", file=sys.stderr, flush=True)


@dataclass
class Serving:
    host: int | None = None
    """The host this machine serves (None: not yet claimed)."""
    generation: int = -1
    addresses: dict[int, str] = field(default_factory=dict)
    """The peers' replica endpoints of this generation, by host."""
    world: list[int] | None = None
    """The hosts taking part in this generation (replicas go only to them; None: every host)."""
