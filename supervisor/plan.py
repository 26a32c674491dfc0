"""Everything a supervisor needs to know about its job, written once by whoever starts it.

The local runtime writes `plan.json` into the run directory; in a pod the same fields come from the
rendered environment (supervisor.pod.pod_plan). The plan is a value: the TrainingJob in it is the
pydantic model, validated once per process where the plan is made or read, and JSON only at that
edge (`write`, `read`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from slicekeeper.api import TrainingJob, dump_training_job, parse_training_job
from slicekeeper.shape import JobLayout, JobShape

JOB_FIELD = "job"
"""The TrainingJob's key in plan.json (as JSON, camelCase)."""
SHAPE_FIELD = "shape"
"""The layout's key in plan.json: its shape (the job's name is the TrainingJob's)."""
_IN_JSON_FORM = ("training_job", "layout")
"""The fields plan.json holds in their JSON form, as `job` and `shape`."""


@dataclass(frozen=True, kw_only=True)
class JobPlan:
    training_job: TrainingJob
    """The validated TrainingJob (in plan.json: `job`, as JSON)."""
    layout: JobLayout
    """The job as its supervisors run it, its hosts by name: the TPU slices' shape in a pod, scaled
    down locally (slicekeeper.shape; in plan.json: `shape`)."""
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
    relay_ports: list[int] = field(default_factory=list)
    """Locally, with spec.controlPlane.relays: the port each host's relay listens at (index: the host;
    empty otherwise, and in a pod, where every relay listens at protocol.RELAY_PORT)."""
    credentials: str = ""
    """The directory of the job's credentials (slicekeeper.credentials): its supervisors connect to
    each other with them, and refuse whoever has none. Locally in the run directory; in a pod, the
    job's Secret mounted. A supervisor without them does not start."""

    def __post_init__(self) -> None:
        name = self.training_job.metadata.name
        if self.layout.job_name != name:
            raise ValueError(f"the layout names job {self.layout.job_name!r}, the TrainingJob is {name!r}")

    @property
    def shape(self) -> JobShape:
        return self.layout.shape

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
        document: dict[str, Any] = {
            JOB_FIELD: dump_training_job(self.training_job),
            SHAPE_FIELD: asdict(self.shape),
        }
        document |= {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _IN_JSON_FORM}
        path.write_text(json.dumps(document, indent=1))

    @classmethod
    def read(cls, path: Path) -> JobPlan:
        """The plan `write` wrote, its TrainingJob validated (UserError naming what is wrong)."""
        document: dict[str, Any] = json.loads(path.read_text())
        job = parse_training_job(document.pop(JOB_FIELD), f"{path} {JOB_FIELD}")
        layout = JobLayout(job.metadata.name, JobShape(**document.pop(SHAPE_FIELD)))
        return cls(**document, training_job=job, layout=layout)
