"""A local run's live progress, read from its leader's status lines as a watcher.

`slicekeeper run` (supervisor.local.local_runtime) connects to the job's leader as a watcher
(messages.Watch) and shows each status and event note (supervisor.local.live_view), following the leader
the job's lease names when it changes. The statuses also say when the job reached a step at which
chaos `spare:+N@step=S` brings new spare machines in (they join through the run's machines' keepers).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Protocol

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader.election import LEASE_FILE, read_lease_file
from slicekeeper.supervisor.local.live_view import RunView
from slicekeeper.supervisor.plan import JobPlan
from slicekeeper.supervisor.tls import JobTls

from slicekeeper import protocol
from slicekeeper.chaos import ChaosKind, Fault

LEADER_WAIT_SECONDS = 60.0
"""How long the watch looks for a leader (the first, or the next one the lease names) before it
gives up showing progress."""


class Spares(Protocol):
    """Where the spare machines due at a step join the run: its machines' keepers
    (supervisor.local.local_runtime.Machines, which runs this watch)."""

    def next_spare(self) -> str:
        """The name of the next spare machine to join."""
        ...

    def keep_spare(self, plan: JobPlan, plan_path: Path, machine: str, joined_by: str | None = None) -> None:
        """Run spare machine `machine`'s supervisor until it ends (`joined_by`: the chaos fault)."""
        ...


class StatusWatch:
    """The leader's status lines shown as they come, and the spare machines due at a step brought in."""

    def __init__(
        self, plan: JobPlan, plan_path: Path, *, view: RunView, machines: Spares, faults: tuple[Fault, ...]
    ) -> None:
        """`plan`, `plan_path`: the run's plan and where the supervisors read it; `faults`: the run's
        chaos faults, of which `spare:+N@step=S` bring machines in."""
        self._plan = plan
        self._plan_path = plan_path
        self._view = view
        self._machines = machines
        self._capacity = [f for f in faults if f.kind is ChaosKind.SPARE]
        """Chaos `spare:+N@step=S`: spare machines that join when the job reaches step S."""
        self._printed_ports = False

    async def run(self) -> None:
        """Show live progress from the leader's status lines (and bring in spares due at a step),
        following the leader the job's lease names when it changes."""
        lease_file = Path(self._plan.run_dir) / LEASE_FILE
        tls = JobTls(Path(self._plan.credentials))
        address, deadline = self._plan.leader, time.time() + LEADER_WAIT_SECONDS
        while True:
            host, port = address.rsplit(":", 1)
            try:
                reader, writer = await tls.connect(host, int(port), limit=protocol.CONTROL_LINE_LIMIT)
            except OSError:
                if time.time() > deadline:
                    return
                await asyncio.sleep(0.2)
                lease = await asyncio.to_thread(read_lease_file, lease_file)
                if lease is not None and lease.leader is not None:
                    address = lease.leader.address
                continue
            writer.write(messages.Watch().encode())
            await self._show(reader)
            writer.close()
            deadline = time.time() + LEADER_WAIT_SECONDS

    async def _show(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(OSError):  # ConnectionError, or ssl.SSLError on a cut TLS stream
            while line := await reader.readline():
                message = messages.to_watcher(line)
                if isinstance(message, messages.EventNote):
                    self._view.event(message.text, message.t)
                    continue
                if self._capacity and message.state == "running":
                    self._capacity_returns(max(h.step for h in message.hosts))
                ports = [h.metrics_port for h in message.hosts]
                if not self._printed_ports and all(ports):
                    self._printed_ports = True
                    self._view.say(
                        "  metrics: "
                        + ", ".join(f"host {i} http://127.0.0.1:{p}/metrics" for i, p in enumerate(ports))
                    )
                self._view.status(message)

    def _capacity_returns(self, step: int) -> None:
        """Chaos `spare:+N@step=S`: the job reached step S, N new spare machines join it."""
        for fault in [f for f in self._capacity if f.step <= step]:
            self._capacity.remove(fault)
            for _ in range(fault.count):
                spare = self._machines.next_spare()
                self._view.event(f"chaos: {fault}: {spare} joins")
                self._machines.keep_spare(self._plan, self._plan_path, spare, joined_by=str(fault))
