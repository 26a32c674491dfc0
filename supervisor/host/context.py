"""What every part serving one host shares, fixed once the host is known.

A supervisor serves one host for the rest of its life once it knows which (at its start, or when the
leader assigns a spare one), so its parts (host.generation, host.sdk_events, host.chaos,
host.workload) are handed one frozen `HostContext` at construction instead of asking for the host,
its identity or its account again and again. What does change (the generation, the standby, whether
this supervisor leads) stays with the part that changes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slicekeeper.supervisor.host.site import Site
from slicekeeper.supervisor.host.workload import Spawn
from slicekeeper.supervisor.metrics import SupervisorMetrics
from slicekeeper.supervisor.plan import JobPlan
from slicekeeper.supervisor.reporting import Log, Report

from slicekeeper.goodput import GoodputAccountant
from slicekeeper.shape import HostId

Say = Callable[[str], None]
"""A line on stderr, naming the host."""


@dataclass(frozen=True, kw_only=True)
class HostContext:
    plan: JobPlan
    site: Site
    """Local process or pod (supervisor.host.site)."""
    identity: HostId
    """The host served: its index (the JAX process id), slice and worker."""
    machine: str
    """The machine serving it (`host-i`, `spare-j`, a node's name in a pod)."""
    folder: Path
    """The machine's folder: its event log, the workload's log and TMPDIR, the SDK socket."""
    accountant: GoodputAccountant
    """This host's account of time, from the moment this machine serves it (slicekeeper.goodput)."""
    metrics: SupervisorMetrics
    log: Log
    report: Report
    """To the leader, stamped with this host."""
    say: Say
    spawn: Spawn
    finished: asyncio.Event
    """Set when the supervisor ends."""

    @property
    def host(self) -> int:
        return self.identity.index
