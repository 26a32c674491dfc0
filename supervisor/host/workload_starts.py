"""What the served host's workloads are started with, and when the next standby is pre-started.

A workload's environment is a function of the host's context, the leader's start and what it takes
from the machine (supervisor.host.workload.workload_env). Here the served host keeps the two that
change: the leader's newest start (before its first, the one presumed), which the next standby is
made for, and the machine as it is when a workload starts (the SDK socket, its temporary directory,
the local tier's folder, the cores, the chaos `slow` spec as it stands). A standby is pre-started
when the host begins to serve, and again once the generation is productive again (host.sdk_effects).
"""

from __future__ import annotations

import os
from pathlib import Path

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.host.chaos import Chaos
from slicekeeper.supervisor.host.context import HostContext
from slicekeeper.supervisor.host.sdk_socket import sdk_socket_path
from slicekeeper.supervisor.host.workload import (
    Standby,
    WorkloadMachine,
    Workloads,
    presumed_start,
    workload_env,
)


class WorkloadStarts:
    """The leader's newest start and the machine the host's workloads start on: each workload's
    environment, and the standby pre-started for the next start."""

    def __init__(
        self, context: HostContext, *, workloads: Workloads, chaos: Chaos, checkpoint_dir: Path
    ) -> None:
        """`checkpoint_dir`: the local tier's folder (supervisor.checkpoints.tiers); `chaos`: the
        faults aimed at the host, of which `slow` is a property of the machine."""
        self._context = context
        self._workloads = workloads
        self._chaos = chaos
        self._checkpoint_dir = checkpoint_dir
        self.socket = sdk_socket_path(context.folder)
        """The SDK socket the workloads connect to (supervisor.host.sdk_socket)."""
        self._newest = presumed_start(context.plan.shape.host_count, context.host)
        """The leader's newest start (before its first, the one presumed): what the next standby is
        made for."""

    def env(self, start: messages.Start) -> dict[str, str]:
        """The workload's environment for `start`, from what this host holds (supervisor.host.workload)."""
        machine = WorkloadMachine(
            socket=self.socket,
            temp_dir=self._context.folder / "tmp",
            checkpoint_dir=self._checkpoint_dir,
            cores=self._context.site.cores(),
            environ=os.environ,
            slow=self._chaos.slow_spec(),
            hold=self._chaos.hold_spec(),
        )
        return workload_env(self._context, start, machine)

    def started(self, start: messages.Start) -> dict[str, str]:
        """The leader's newest start, `start`: the next standby is made for it; its workload's
        environment."""
        self._newest = start
        return self.env(start)

    def prestart(self) -> None:
        """Pre-start a standby for the newest start, in the background (supervisor.host.workload)."""
        self._context.spawn(self._workloads.prestart(self.env(self._newest)))

    def standby(self) -> Standby | None:
        """The standby pre-started, if one is (it says hello on the SDK socket)."""
        return self._workloads.standby
