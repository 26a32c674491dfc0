"""The sections of a TrainingJob's spec (what the user asks for), and the base of every API model.

Import them from `slicekeeper.api`: it re-exports every model here and stays the API's one import
point and the CRD's source. This module holds the spec (slice shape, workload, checkpoint tiers,
policy, health, local mode, Kueue) so that `api.py` holds the object around it (metadata, status)
and how a TrainingJob is read and written.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from slicekeeper import tpu

DEFAULT_COMMAND = ["python", "-m", "slicekeeper.workload.reference.jax_trainer"]


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


class CompilationCacheSpec(Model):
    """Where each host keeps the programs it compiled, so that a restarted workload loads them
    instead of compiling (workload/compiled_programs.py)."""

    claim_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="A PersistentVolumeClaim every pod of the job mounts (ReadWriteMany: a Filestore "
        "share, or a bucket through the GCS FUSE CSI driver), writable by the image's user: a "
        "replacement pod, or the spare that takes over a host, loads what the host it replaces "
        "compiled. Absent: each pod keeps its own (an emptyDir): a restart within the pod loads, a "
        "replacement pod compiles once. Ignored by `slicekeeper run`, whose hosts share a folder.",
    )


class WorkloadSpec(Model):
    """What runs on every host: the user's training command (the reference JAX trainer by default)."""

    image: str = Field(default="ghcr.io/slicekeeper/slicekeeper:latest", description="Container image.")
    command: list[str] = Field(default_factory=lambda: list(DEFAULT_COMMAND), min_length=1)
    args: list[str] = Field(default_factory=list)
    env: list[EnvVar] = Field(default_factory=list)
    steps: PositiveInt = Field(default=200, description="Training steps the workload runs in total.")
    init_from: str | None = Field(
        default=None,
        min_length=1,
        description="A checkpoint in the framework's standard format (an orbax checkpoint for JAX, a "
        "torch.distributed.checkpoint directory for PyTorch; e.g. made by `slicekeeper checkpoint "
        "export`) that the job starts from, resharded onto its mesh, at the step it holds, until the job "
        "has a checkpoint of its own. A path every host can read, or a URI the framework reads.",
    )
    compilation_cache: CompilationCacheSpec = Field(default_factory=CompilationCacheSpec)
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
    call_timeout_seconds: PositiveFloat = Field(
        default=300.0,
        description="Each call to the store (an upload or download of one shard, a listing, a commit) "
        "gets this long; one that takes longer is given up (a hung store never hangs a save or a "
        "restore).",
    )
    attempts: PositiveInt = Field(
        default=3, description="Tries of a store call that failed or timed out, 1 s apart, doubling."
    )


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


class DisruptionSpec(Model):
    """Losses announced ahead of time: a node's maintenance, a preemption, a pod deleted with a grace."""

    termination_grace_period_seconds: PositiveInt = Field(
        default=30,
        description=(
            "The pods' terminationGracePeriodSeconds: how long a supervisor told to stop (SIGTERM: "
            "preemption, a drained node) has to save the current step and hand its host over."
        ),
    )


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
        default=3.0,
        description="Hang timeout = max(floor, factor x the 95th percentile of the last 32 step times).",
    )
    warmup_timeout_per_host_seconds: PositiveFloat = Field(
        default=0.25,
        description="For the 3 steps after the first of every (re)start, the hang timeout is at least "
        "this x the hosts of the world (at most startupTimeoutSeconds): a wider world's first steps "
        "take longer.",
    )
    startup_timeout_seconds: PositiveFloat = Field(
        default=120.0, description="Allowance from process start to the first completed step."
    )
    phase_timeout_seconds: PositiveFloat = Field(
        default=60.0, description="Allowance for a reported non-step phase (checkpoint save, restore)."
    )
    connection_deadline_seconds: Annotated[float, Field(ge=0)] = Field(
        default=5.0,
        description="A connection between supervisors (member and leader, peers) that carries nothing, "
        "not even the kernel's keepalive probes, for this long is dead: its host is lost, or its "
        "leader is (a leader that hears no member for this long stands down). 0: no deadline (TCP's "
        "own, hours).",
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


class NetworkSpec(Model):
    """Cluster: who may reach the job's pods (the job's NetworkPolicy, docs/security.md)."""

    metrics_namespace: str | None = Field(
        default="monitoring",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Namespace whose pods may scrape the supervisors' metrics port (a Prometheus); "
        "null: none. Only the job's own pods reach its other ports.",
    )


class ControlPlaneSpec(Model):
    """How the hosts' supervisors reach the job's leader (docs/architecture.md, "Relays")."""

    relays: bool = Field(
        default=False,
        description="Each group of hosts reaches the leader through a relay, one of the group's "
        "supervisors: the leader holds one connection per group instead of one per host.",
    )
    hosts_per_relay: PositiveInt = Field(
        default=64,
        description="Hosts of a relay's group, at least: the group is as many whole slices as make "
        "this many hosts (a slice's hosts go together, in a host event as in a restart).",
    )
    lease_candidates: PositiveInt = Field(
        default=3,
        description="With relays: how many hosts' supervisors read and write the job's Lease (host 0 "
        "and hosts of slices spread over the job); every other supervisor, spares included, asks them "
        "who leads, so the job's Lease requests do not grow with its size.",
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
    disruption: DisruptionSpec = Field(default_factory=DisruptionSpec)
    local: LocalSpec = Field(default_factory=LocalSpec)
    kueue: KueueSpec | None = Field(default=None, description="Admit the pods through Kueue (cluster).")
    network: NetworkSpec = Field(default_factory=NetworkSpec)
    control_plane: ControlPlaneSpec = Field(default_factory=ControlPlaneSpec)
    service_account_name: str = Field(
        default="slicekeeper-supervisor",
        description="Service account of the pods (the chart gives it the supervisors' Role).",
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
