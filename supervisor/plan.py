"""Everything a supervisor needs to know about its job, written once by whoever starts it.

The local runtime writes `plan.json` into the run directory; in a pod the same fields come from the
rendered environment. Validated data only: the TrainingJob inside was checked by the pydantic model.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slicekeeper.api import TrainingJob, parse_training_job
from slicekeeper.shape import JobLayout, JobShape


@dataclass(frozen=True, kw_only=True)
class JobPlan:
    job: dict[str, object]
    """The validated TrainingJob, as JSON (camelCase)."""
    shape: JobShape
    """The job as its supervisors run it: the TPU slices' shape in a pod, scaled down locally
    (slicekeeper.shape)."""
    run_dir: str
    leader: str
    """host:port of the coordination leader (slice 0, worker 0)."""
    total_steps: int
    checkpoint_root: str
    compilation_cache: str | None
    local: bool = True
    chaos: list[str] = field(default_factory=list)
    """Faults (as spec strings), each for the host it names."""
    metrics_port: int = 0
    spares: int = 0
    """Spare supervisors (machines `spare-0`, ...) waiting to take over a lost host's identity."""
    run_key: str = ""
    """This run's folder under the persistent tier's URI: `<job name>/<run id>`."""
    address: str | None = None
    """In a pod: the pod's IP, where the supervisor's servers listen and peers reach them (None: the
    leader's host locally; all interfaces, reached by host name, in a pod without POD_IP)."""
    replacement_timeout: float | None = None
    """In a pod: how long the leader awaits a lost host's replacement pod (None: locally, spares)."""
    credentials: str = ""
    """The directory of the job's credentials (slicekeeper.credentials): its supervisors connect to
    each other with them, and refuse whoever has none. Locally in the run directory; in a pod, the
    job's Secret mounted. A supervisor without them does not start."""

    @property
    def training_job(self) -> TrainingJob:
        return parse_training_job(self.job, "plan.json job")

    @property
    def layout(self) -> JobLayout:
        return JobLayout(str(self.training_job.metadata.name), self.shape)

    @property
    def machines(self) -> list[str]:
        """Every supervisor's machine: one per host (`host-i`), then the spares (`spare-j`)."""
        hosts = [f"host-{h}" for h in range(self.shape.host_count)]
        return hosts + [f"spare-{j}" for j in range(self.spares)]

    def machine_dir(self, machine: str) -> Path:
        """Logs, the SDK socket and the report of one machine's supervisor."""
        return Path(self.run_dir) / machine

    def machine_disk(self, machine: str) -> Path:
        """The machine's own checkpoint storage (RAM disk): its local tier and the replicas it holds."""
        return Path(self.checkpoint_root) / machine

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def read(cls, path: Path) -> JobPlan:
        fields: dict[str, Any] = json.loads(path.read_text())
        return cls(**{**fields, "shape": JobShape(**fields["shape"])})
