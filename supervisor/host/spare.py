"""A spare: a supervisor whose machine serves no host yet, waiting for the leader to assign one.

A spare is a mode of the supervisor, not a host with a placeholder index: it registers as a spare,
watches the lease without campaigning, trains nothing and accounts only its own wait. When the
leader assigns it a host (messages.Assign, on the connection it registered on), the supervisor
serves that host from then on (supervisor.host.served_host), with the machine's connection, metrics
and checkpoint server carried over.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoints.tiers import CheckpointTiers
from slicekeeper.supervisor.host.host_report import spare_report
from slicekeeper.supervisor.host.machine_record import MachineRecord
from slicekeeper.supervisor.host.sdk_socket import remove_sdk_socket, sdk_socket_path
from slicekeeper.supervisor.host.site import spare_index

from slicekeeper.goodput import Booked, GoodputAccountant


class Spare:
    """A supervisor's mode while its machine waits for a host: no host, no identity, no journal."""

    host: None = None
    """It serves no host."""
    identity: None = None
    journal: None = None

    def __init__(
        self,
        machine: str,
        folder: Path,
        *,
        joined_by: str | None,
        record: MachineRecord,
        booked: Booked,
    ) -> None:
        """`folder`: the machine's; `joined_by`: the chaos fault that brought it in, for the report;
        `record`: the machine's (supervisor.host.machine_record), which the host it is assigned is
        written to; `booked`: where its account's intervals go (the event log)."""
        self.index = spare_index(machine)
        self.joined_by = joined_by
        self.record = record
        self._folder = folder
        self._sdk_socket = sdk_socket_path(folder)
        """Where the SDK socket of the host it serves will be: a place it may not use ends it now."""
        self.accountant = GoodputAccountant(time.time(), booked=booked)

    def registration(self, hello: dict[str, Any], rejoining: bool) -> messages.RegisterSpare:
        """It offers itself to every leader it joins, the same way."""
        return messages.RegisterSpare(spare=self.index, chaos=self.joined_by, **hello)

    def interrupt(self) -> None:
        self.accountant.interrupt(time.time())

    async def end(self) -> None:
        """The socket's private directory, if its path needed one, goes (supervisor.host.sdk_socket)."""
        remove_sdk_socket(self._sdk_socket, self._folder)

    def account(
        self, *, machine: str, end: str | None, tiers: CheckpointTiers, exit_code: int | None, now: float
    ) -> dict[str, Any]:
        return spare_report(
            machine=machine, end=end, accountant=self.accountant, tiers=tiers, exit_code=exit_code, now=now
        )
