"""The TrainingJob API (`slicekeeper.dev/v1alpha1`) as pydantic models.

One source of truth: the CLI validates YAML with these models, the operator re-validates objects
from the cluster with them, and `crds/trainingjob.yaml` is generated from them (slicekeeper.crd).
Field names follow Kubernetes conventions (camelCase on the wire, snake_case in Python). The
spec's sections are defined in `slicekeeper.api_spec` and re-exported here: this module is the API's
one import point.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from slicekeeper import tpu
from slicekeeper.api_spec import (
    DEFAULT_COMMAND,
    CheckpointSpec,
    CompilationCacheSpec,
    ControlPlaneSpec,
    EnvVar,
    HealthSpec,
    KueueSpec,
    LevelBudget,
    LocalSpec,
    Model,
    NetworkSpec,
    PeerTierSpec,
    PersistentTierSpec,
    PolicyBudgets,
    PolicyRef,
    ReplaceBudget,
    RestartBudget,
    ScaleDownBudget,
    TpuSpec,
    TrainingJobSpec,
    WorkloadSpec,
)
from slicekeeper.errors import UserError
from slicekeeper.shape import JobLayout, JobShape

API_GROUP = "slicekeeper.dev"
API_VERSION = "v1alpha1"
KIND = "TrainingJob"
PLURAL = "trainingjobs"
SHORT_NAME = "tj"

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "DEFAULT_COMMAND",
    "KIND",
    "PLURAL",
    "SHORT_NAME",
    "CheckpointSpec",
    "CompilationCacheSpec",
    "Condition",
    "ControlPlaneSpec",
    "EnvVar",
    "HealthSpec",
    "JobPhase",
    "KueueSpec",
    "LastRestore",
    "LevelBudget",
    "LocalSpec",
    "Metadata",
    "Model",
    "NetworkSpec",
    "PeerTierSpec",
    "PersistentTierSpec",
    "PolicyBudgets",
    "PolicyRef",
    "ReplaceBudget",
    "RestartBudget",
    "ScaleDownBudget",
    "TpuSpec",
    "TrainingJob",
    "TrainingJobSpec",
    "TrainingJobStatus",
    "WorkloadSpec",
    "dump_training_job",
    "format_validation_error",
    "load_training_job",
    "parse_training_job",
]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


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


class Replacing(Model):
    """A hot-swap the operator began: what the pod's replacement carries (operator/replacements.py)."""

    uid: str | None = Field(default=None, description="The uid of the pod being replaced.")
    avoid_nodes: list[str] = Field(default_factory=list, description="Nodes the host failed on.")
    hot_swaps: int = Field(default=1, description="The replacement's hot-swap count.")
    reason: str = ""


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
    replacing: dict[str, Replacing] = Field(
        default_factory=dict,
        description="Pods being replaced, by name: written before the operator deletes one, taken off "
        "once its replacement exists (an operator restarted in between creates it as planned).",
    )


class TrainingJob(Model):
    api_version: Literal["slicekeeper.dev/v1alpha1"]
    kind: Literal["TrainingJob"]
    metadata: Metadata
    spec: TrainingJobSpec
    status: TrainingJobStatus | None = None

    @property
    def slice_shape(self) -> tpu.SliceShape:
        """One TPU slice's hardware: its chips and hosts (slicekeeper.tpu)."""
        return self.spec.tpu.shape()

    @property
    def shape(self) -> JobShape:
        """The job's shape on its TPU slices: spec.slices slices of the slice's hosts, each with its
        chips (a local run scales it down: slicekeeper.api.local_layout)."""
        tpu_slice = self.slice_shape
        return JobShape(self.spec.slices, tpu_slice.host_count, tpu_slice.chips_per_host)

    @property
    def total_hosts(self) -> int:
        return self.shape.host_count


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


DEFAULT_LOCAL_HOSTS = 4
"""Host processes of a local run when spec.local.hosts is not set (at most the real job's)."""


def cluster_layout(job: TrainingJob) -> JobLayout:
    """The job as its TPU slices have it (TrainingJob.shape)."""
    return JobLayout(job.metadata.name, job.shape)


def local_layout(job: TrainingJob) -> JobLayout:
    """The job scaled down to fit one machine: `spec.local.hosts` host processes (default
    min(4, hosts of the real job)), each faking `spec.local.devicesPerHost` CPU devices. The slice
    count is kept when the hosts allow it (every slice keeps at least one host); hosts are split evenly
    over slices."""
    local = job.spec.local
    requested = local.hosts if local.hosts is not None else min(DEFAULT_LOCAL_HOSTS, job.shape.host_count)
    slices = min(job.spec.slices, requested)
    if local.hosts is not None and requested % slices:
        raise UserError(
            f"spec.local.hosts: {requested} hosts do not split evenly over {slices} slices "
            f"(spec.slices); use a multiple of {slices}"
        )
    return JobLayout(job.metadata.name, JobShape(slices, requested // slices, local.devices_per_host))
