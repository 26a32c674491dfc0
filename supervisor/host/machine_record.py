"""What a machine remembers across restarts of its supervisor: the host it serves, the chaos it fired.

A supervisor process can die while its machine lives on (chaos `crash-supervisor`; locally the
runtime then starts it again on the same machine, as a kubelet restarts a container). The job's
memory is the leader's (supervisor.leader.journal), but two facts belong to the machine and must
survive its supervisor, so they are written to the machine's own folder as they change:
- the host it serves: a spare that took a host over is that host when its supervisor comes back;
- the chaos faults fired on it, and its `slow` factor: a fault fires once per job, even when the
  supervisor that fired it died before the leader could journal it, and a slow machine stays slow.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

RECORD_FILE = "machine.json"


@dataclass
class MachineRecord:
    path: Path
    host: int | None = None
    """The host this machine serves (None: a spare not assigned yet)."""
    fired: list[str] = field(default_factory=list)
    """The chaos faults fired on this machine, as written in --chaos."""
    slow: float | None = None
    """The machine's `slow` factor once that fault fired."""

    @classmethod
    def of(cls, machine_dir: Path) -> MachineRecord:
        """The record in `machine_dir` (an empty one on a machine's first start)."""
        path = machine_dir / RECORD_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(path)
        return cls(path, host=data.get("host"), fired=list(data.get("fired", [])), slow=data.get("slow"))

    def save(self) -> None:
        """Written whole and renamed into place: a supervisor dying mid-write leaves the old record."""
        data = {k: v for k, v in asdict(self).items() if k != "path"}
        temporary = self.path.with_suffix(".tmp")
        with temporary.open("w") as out:
            json.dump(data, out)
            out.flush()
            os.fsync(out.fileno())
        temporary.replace(self.path)

    def claim(self, host: int | None, *, restarted: bool) -> int | None:
        """The host a supervisor starting on this machine serves: on a restart, the one the machine
        served before (a spare may have taken one over); else `host` (None: a spare)."""
        if restarted and self.host is not None:
            return self.host
        if host is not None and self.host != host:
            self.serve(host)
        return host

    def serve(self, host: int) -> None:
        self.host = host
        self.save()

    def fire(self, spec: str, *, slow: float | None = None) -> None:
        """Noted before the fault is inflicted: a fault that kills the supervisor is noted all the same."""
        if spec not in self.fired:
            self.fired.append(spec)
        if slow is not None:
            self.slow = slow
        self.save()
