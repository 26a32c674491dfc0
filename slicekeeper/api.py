"""The TrainingJob API (`slicekeeper.dev/v1alpha1`) as pydantic models.

One source of truth: the CLI validates YAML with these models, the operator re-validates objects
from the cluster with them, and `crds/trainingjob.yaml` is generated from them (slicekeeper.crd).
Field names follow Kubernetes conventions (camelCase on the wire, snake_case in Python).
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from slicekeeper import tpu
from slicekeeper.errors import UserError

API_GROUP = "slicekeeper.dev"
API_VERSION = "v1alpha1"
KIND = "TrainingJob"
PLURAL = "trainingjobs"
SHORT_NAME = "tj"

DEFAULT_COMMAND = ["python", "-m", "slicekeeper.workload.reference.jax_trainer"]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class Model(BaseModel):
    """Base for every API object: camelCase aliases, unknown fields rejected, frozen values."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


class TpuSpec(Model):
    """The slice shape: a TPU type (`v5p-16`) and/or an accelerator with a topology."""

    type: str | None = Field(default=None, description="TPU type, e.g. v5p-16, v5e-16, v4-32, v6e-8.")
    accelerator: str | None = Field(
        default=None, description="GKE accelerator label, e.g. tpu-v5p-slice (derived from type if absent)."
    )
    topology: str | None = Field(default=None, description="Slice topology, e.g. 2x2x2 or 4x4.")
    chips_per_host: Literal[1, 4, 8] | None = Field(
        default=None, description="Chips per VM (v5e/v6e machine type: 1, 4 or 8); derived if absent."
    )

    @model_validator(mode="after")
    def _shape_is_real(self) -> TpuSpec:
        try:
            self.shape()
        except tpu.TpuShapeError as error:
            raise ValueError(str(error)) from None
        return self

    def shape(self) -> tpu.SliceShape:
        return tpu.resolve(
            tpu_type=self.type,
            accelerator=self.accelerator,
            topology=self.topology,
            chips_per_host=self.chips_per_host,
        )


class EnvVar(Model):
    name: str = Field(min_length=1)
    value: str = ""


class WorkloadSpec(Model):
    """What runs on every host: the user's training command (the reference JAX trainer by default)."""

    image: str = Field(default="ghcr.io/slicekeeper/slicekeeper:latest", description="Container image.")
    command: list[str] = Field(default_factory=lambda: list(DEFAULT_COMMAND), min_length=1)
    args: list[str] = Field(default_factory=list)
    env: list[EnvVar] = Field(default_factory=list)
    steps: PositiveInt = Field(default=200, description="Training steps the workload runs in total.")
    standby: bool = Field(
        default=False,
        description="Keep a pre-started workload process (imports done) waiting to replace the workload "
        "at the next restart. Only for loops that call the SDK's connect() before any work.",
    )


class PeerTierSpec(Model):
    """Copies of each host's local checkpoints on other hosts, sent over the network between supervisors."""

    replicas: Annotated[int, Field(ge=0)] = Field(
        default=1, description="Hosts that keep a copy of each host's shard (0 turns the peer tier off)."
    )
    max_to_keep: PositiveInt = Field(default=2, description="Replicated steps kept per host and owner.")


class PersistentTierSpec(Model):
    """Rare saves to storage that outlives every host: a directory or an object-store URI."""

    uri: str = Field(
        min_length=1,
        description="Directory, file:// or object-store URI (gs://, s3:// with gcsfs or s3fs installed).",
    )
    interval: PositiveInt = Field(
        default=50, description="Steps between persistent saves; a multiple of spec.checkpoint.interval."
    )
    max_to_keep: PositiveInt = Field(default=2, description="Persistent checkpoints kept.")


class CheckpointSpec(Model):
    """Checkpoint tiers: local (each host, RAM-backed by default), peer, persistent (optional)."""

    local_dir: str = Field(
        default="/dev/shm/slicekeeper", description="Per-host local tier directory (RAM disk by default)."
    )
    interval: PositiveInt = Field(default=10, description="Steps between local-tier saves.")
    max_to_keep: PositiveInt = Field(default=3, description="Local-tier checkpoints kept per host.")
    peer: PeerTierSpec = Field(default_factory=PeerTierSpec)
    persistent: PersistentTierSpec | None = Field(
        default=None, description="The persistent tier; absent: no persistent saves."
    )

    @model_validator(mode="after")
    def _persistent_saves_are_local_saves(self) -> CheckpointSpec:
        # The persistent tier uploads a committed local step: only local steps can be persisted.
        if self.persistent is not None and self.persistent.interval % self.interval:
            raise ValueError(
                f"persistent.interval ({self.persistent.interval}) must be a multiple of "
                f"interval ({self.interval}): a persistent save uploads a local checkpoint"
            )
        return self


NonNegativeInt = Annotated[int, Field(ge=0)]


class LevelBudget(Model):
    """One rung of the escalation ladder: at most `max` uses within any `windowSeconds`."""

    max: NonNegativeInt = Field(description="Uses allowed within the window (0: never).")
    window_seconds: PositiveFloat = Field(default=3600.0, description="Length of the sliding window.")


class RestartBudget(LevelBudget):
    max: NonNegativeInt = Field(default=10, description="In-job restarts the policy may order per window.")


class ReplaceBudget(LevelBudget):
    max: NonNegativeInt = Field(default=4, description="Hot-swaps (host replaced by a spare) per window.")


class ScaleDownBudget(LevelBudget):
    max: NonNegativeInt = Field(default=4, description="Elastic scale-downs per window.")


class PolicyBudgets(Model):
    """Budgets of the escalation ladder's levels; spec.health.maxRestarts still caps all restarts."""

    restart: RestartBudget = Field(default_factory=RestartBudget)
    replace: ReplaceBudget = Field(default_factory=ReplaceBudget)
    scale_down: ScaleDownBudget = Field(default_factory=ScaleDownBudget)


class PolicyRef(Model):
    """Which remediation policy decides on faults: `default` (the escalation ladder) or a user file."""

    name: str = Field(default="default")
    file: str | None = Field(
        default=None,
        description="Path of a user policy file (local mode; relative to the TrainingJob file).",
    )
    config_map: str | None = Field(
        default=None,
        description="ConfigMap holding the policy as key policy.py (cluster); pods mount it.",
    )
    source: str | None = Field(
        default=None,
        description="The policy's Python source, inline; the operator stores it in the job's ConfigMap.",
    )
    hook_timeout_seconds: PositiveFloat = Field(
        default=2.0, description="A hook running longer falls back to the default policy for that decision."
    )
    budgets: PolicyBudgets = Field(default_factory=PolicyBudgets)

    @model_validator(mode="after")
    def _one_source(self) -> PolicyRef:
        given = [
            name
            for name, value in (("file", self.file), ("source", self.source), ("configMap", self.config_map))
            if value is not None
        ]
        if len(given) > 1:
            raise ValueError(f"give the policy one way, not {' and '.join(given)}")
        return self


class HealthSpec(Model):
    """Detection settings. See docs/supervisor.md for how the hang timeout is derived."""

    max_restarts: Annotated[int, Field(ge=0)] = Field(
        default=10, description="In-job restarts allowed before the job fails."
    )
    max_restarts_without_progress: PositiveInt = Field(
        default=3, description="Consecutive restarts with no completed step before the job fails."
    )
    hang_timeout_floor_seconds: PositiveFloat = Field(
        default=2.0, description="The hang timeout never goes below this many seconds."
    )
    hang_timeout_factor: PositiveFloat = Field(
        default=3.0, description="Hang timeout = max(floor, factor x typical step time)."
    )
    startup_timeout_seconds: PositiveFloat = Field(
        default=120.0, description="Allowance from process start to the first completed step."
    )
    phase_timeout_seconds: PositiveFloat = Field(
        default=60.0, description="Allowance for a reported non-step phase (checkpoint save, restore)."
    )
    replacement_timeout_seconds: PositiveFloat = Field(
        default=300.0,
        description="Cluster: how long a lost host's replacement pod may take to join before the policy "
        "is asked again with no replacement possible (by default: scale down by whole slices).",
    )


class LocalSpec(Model):
    """How `slicekeeper run` scales the job down to processes on one machine."""

    hosts: PositiveInt | None = Field(
        default=None, description="Local host processes (default: min(4, hosts of the real job))."
    )
    devices_per_host: PositiveInt = Field(default=2, description="CPU devices per local host.")
    work_dir: str | None = Field(default=None, description="Run directory (default: a new temp dir).")
    metrics_port: Annotated[int, Field(ge=0, le=65535)] = Field(
        default=0,
        description="First supervisor metrics port (host i gets port+i, spare j port+hosts+j); 0 picks "
        "free ports.",
    )
    spares: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Spare host processes, ready to take over the identity of a lost host."
    )


class KueueSpec(Model):
    """Gang admission with Kueue plain-pod groups: all of the job's pods are admitted together."""

    queue_name: str = Field(min_length=1, description="Kueue LocalQueue the pods are submitted to.")


class TrainingJobSpec(Model):
    tpu: TpuSpec
    slices: PositiveInt = Field(default=1, description="Number of TPU slices (multislice over DCN).")
    min_slices: PositiveInt = Field(
        default=1, description="Elastic scale-down never leaves the job with fewer slices than this."
    )
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    policy: PolicyRef = Field(default_factory=PolicyRef)
    health: HealthSpec = Field(default_factory=HealthSpec)
    local: LocalSpec = Field(default_factory=LocalSpec)
    kueue: KueueSpec | None = Field(default=None, description="Admit the pods through Kueue (cluster).")
    service_account_name: str = Field(
        default="slicekeeper-supervisor",
        description="Service account of the pods: the supervisor may mark its own pod (operator/rbac.yaml).",
    )
    suspend: bool = Field(
        default=False,
        description="Cluster: true deletes the job's pods; set back to false, it resumes from its "
        "persistent checkpoint.",
    )

    @model_validator(mode="after")
    def _min_slices_fit(self) -> TrainingJobSpec:
        if self.min_slices > self.slices:
            raise ValueError(
                f"minSlices ({self.min_slices}) must not exceed slices ({self.slices}): "
                "scale-down keeps at least minSlices of the job's slices"
            )
        return self


class Metadata(Model):
    """The part of ObjectMeta slicekeeper reads; the rest is kept as given."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow", frozen=True)
    name: str
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _dns_label(cls, name: str) -> str:
        if len(name) > 40 or not _DNS_LABEL.match(name):
            raise ValueError(
                "must be a DNS label of at most 40 characters (lowercase letters, digits, '-'), "
                "so that pod hostnames <name>-s<slice>-w<worker> stay valid"
            )
        return name


class JobPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    INVALID = "Invalid"


class Condition(Model):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None


class LastRestore(Model):
    """The job's most recent start from a checkpoint, as its leader published it."""

    generation: int
    cause: str = Field(
        description="What stopped the job (a fault kind), or `resume` for a start from an "
        "earlier run's persistent checkpoint (a resumed or re-created job)."
    )
    step: int | None = Field(default=None, description="The step restored; empty: from scratch.")
    steps_replayed: int = Field(default=0, description="Steps trained again after the restore.")


class TrainingJobStatus(Model):
    phase: JobPhase = JobPhase.PENDING
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None
    slices_ready: int = 0
    slices_total: int = 0
    slices_active: int | None = None
    step: int | None = None
    restarts: dict[str, int] = Field(default_factory=dict)
    last_checkpoint_step: int | None = None
    last_restore: LastRestore | None = None
    goodput: float | None = Field(default=None, ge=0.0, le=1.0)
    params_fingerprint: str | None = None
    """Once the job succeeded: the digest of its final parameters every host agreed on (a run with
    faults ends with the fault-free run's)."""


class TrainingJob(Model):
    api_version: Literal["slicekeeper.dev/v1alpha1"]
    kind: Literal["TrainingJob"]
    metadata: Metadata
    spec: TrainingJobSpec
    status: TrainingJobStatus | None = None

    @property
    def slice_shape(self) -> tpu.SliceShape:
        return self.spec.tpu.shape()

    @property
    def total_hosts(self) -> int:
        return self.spec.slices * self.slice_shape.hosts


def _location(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts) or "(document)"


def format_validation_error(error: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid TrainingJob"]
    for problem in error.errors():
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            message = "unknown field"
        lines.append(f"  {_location(problem['loc'])}: {message}")
    return "\n".join(lines)


def parse_training_job(document: Any, source: str = "TrainingJob") -> TrainingJob:
    """Validate a decoded document; raise UserError listing every field that is wrong."""
    if not isinstance(document, dict):
        raise UserError(f"{source}: expected a TrainingJob mapping, found {type(document).__name__}")
    try:
        return TrainingJob.model_validate(document)
    except ValidationError as error:
        raise UserError(format_validation_error(error, source)) from None


def load_training_job(path: str | Path) -> TrainingJob:
    """Read and validate a TrainingJob YAML file (the first document of kind TrainingJob)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as error:
        raise UserError(f"{file}: cannot read the TrainingJob file: {error.strerror or error}") from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise UserError(f"{file}: not valid YAML: {error}") from None
    if not documents:
        raise UserError(f"{file}: the file is empty")
    jobs = [d for d in documents if isinstance(d, dict) and d.get("kind") == KIND]
    return parse_training_job(jobs[0] if jobs else documents[0], str(file))


def dump_training_job(job: TrainingJob) -> dict[str, Any]:
    return job.model_dump(mode="json", by_alias=True, exclude_none=True)
