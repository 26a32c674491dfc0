"""The wire between a supervisor and its workload, and the environment a workload starts with.

Kept in the core, stdlib only, so the workload SDK (which must stay light) and the supervisor share
one definition. Messages are JSON objects, one per line, over a Unix socket the supervisor listens on.

Environment precedence: the supervisor sets every variable below for the workload it spawns; a
value already present in the user's `spec.workload.env` is overridden for the `SLICEKEEPER_*`
identity variables (the supervisor owns identity) and kept for everything else.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any, Final

# --- identity and wiring, set by the supervisor for the workload -------------------------------
ENV_SOCKET: Final = "SLICEKEEPER_SOCKET"
"""Unix socket path of this host's supervisor. Absent: the SDK runs standalone (events dropped)."""
ENV_HOST: Final = "SLICEKEEPER_HOST"
"""Global host index = slice * hosts_per_slice + worker: which shard and checkpoint this host owns.

Fixed for the life of the job; equal to the JAX process id only while every host takes part."""
ENV_NUM_HOSTS: Final = "SLICEKEEPER_NUM_HOSTS"
"""Hosts taking part in this generation: the JAX world size (fewer than the job's after a
scale-down)."""
ENV_PROCESS_ID: Final = "SLICEKEEPER_PROCESS_ID"
"""This host's rank in this generation's world = its JAX process id, 0 .. num_hosts - 1.
Absent: the host index (every host takes part)."""
ENV_FULL_HOSTS: Final = "SLICEKEEPER_FULL_HOSTS"
"""Hosts of the full job, what the global batch is sized for; a scaled-down generation keeps that
batch by accumulating gradients. Absent: the number of hosts of this generation."""
ENV_GENERATION: Final = "SLICEKEEPER_GENERATION"
"""Restart generation every host of the job agreed on; 0 for the first start."""
ENV_COORDINATOR: Final = "SLICEKEEPER_COORDINATOR"
"""host:port of the jax.distributed coordinator for this generation."""
ENV_RESTORE_STEP: Final = "SLICEKEEPER_RESTORE_STEP"
"""Checkpoint step every host agreed to restore, or empty for a fresh start."""
ENV_RESTORE_VERIFIED: Final = "SLICEKEEPER_RESTORE_VERIFIED"
"""1 when the supervisor stages and verifies this host's shard of every restore step in the local tier
before the workload starts: the workload need not hash it again."""
ENV_TOTAL_STEPS: Final = "SLICEKEEPER_TOTAL_STEPS"
ENV_INIT_FROM: Final = "SLICEKEEPER_INIT_FROM"
"""spec.workload.initFrom: a standard-format checkpoint to start from when there is no restore step."""
ENV_CHECKPOINT_DIR: Final = "SLICEKEEPER_CHECKPOINT_DIR"
"""This host's local checkpoint tier directory."""
ENV_CHECKPOINT_INTERVAL: Final = "SLICEKEEPER_CHECKPOINT_INTERVAL"
ENV_CHECKPOINT_KEEP: Final = "SLICEKEEPER_CHECKPOINT_KEEP"
ENV_COMPILATION_CACHE: Final = "SLICEKEEPER_COMPILATION_CACHE"
"""Where a workload keeps the programs it compiled, so that its next start loads them
(workload/compiled_programs.py). Locally one folder of the machine's; in a pod COMPILATION_CACHE_DIR."""
COMPILATION_CACHE_DIR: Final = "/var/cache/slicekeeper"
"""In a pod: the compilation cache's volume (its own emptyDir, or spec.workload.compilationCache's
claim, which the job's pods share)."""
ENV_STANDBY: Final = "SLICEKEEPER_STANDBY"
"""Set to 1 for a pre-started standby process: `connect()` waits for `go` (see STANDBY below)."""
ENV_CHAOS_SLOW: Final = "SLICEKEEPER_CHAOS_SLOW"
"""Chaos `slow` on this machine, `F@S`: from step S on, the SDK stretches the loop's own work of each
step F-fold in `work_done()` (a slow chip: the extra time comes before the host reaches the
collective). Empty or absent: not slowed."""
ENV_CHAOS_HOLD: Final = "SLICEKEEPER_CHAOS_HOLD"
"""Chaos `hang` as a step begins, `S1,S2`: the steps at which the SDK, once it told the supervisor
the step began, waits up to CHAOS_HOLD_SECONDS for the supervisor's SIGSTOP, so that the stop lands
in the step's own work however late a loaded supervisor reads the event (the hang's culprit is told
by where it stopped). Empty or absent: none pending."""
CHAOS_HOLD_SECONDS: Final = 10.0
ENV_DEVICES_PER_HOST: Final = "SLICEKEEPER_DEVICES_PER_HOST"
"""Local mode only: CPU devices this host process fakes."""
ENV_OWN_WORK_CORE: Final = "SLICEKEEPER_OWN_WORK_CORE"
"""Local mode only: the CPU core this host's own work of each step runs on, so that hosts sharing the
machine's cores keep comparable own-work times (see slicekeeper.workload.own_work_core)."""

# GKE TPU conventions (REFERENCES sec. 1), set in pods and by the local runtime alike.
ENV_TPU_WORKER_ID: Final = "TPU_WORKER_ID"
ENV_TPU_WORKER_HOSTNAMES: Final = "TPU_WORKER_HOSTNAMES"
ENV_TPU_NAME: Final = "TPU_NAME"
ENV_MEGASCALE_NUM_SLICES: Final = "MEGASCALE_NUM_SLICES"
ENV_MEGASCALE_SLICE_ID: Final = "MEGASCALE_SLICE_ID"
ENV_MEGASCALE_COORDINATOR_ADDRESS: Final = "MEGASCALE_COORDINATOR_ADDRESS"
ENV_MEGASCALE_PORT: Final = "MEGASCALE_PORT"

# --- in a pod: set by the operator's pod manifest (operator/render.py) --------------------------
ENV_CONFIG_DIR: Final = "SLICEKEEPER_CONFIG_DIR"
"""Where the job's ConfigMap is mounted: the TrainingJob (trainingjob.yaml) and an inline policy."""
CONFIG_DIR: Final = "/etc/slicekeeper"
CONFIG_JOB_FILE: Final = "trainingjob.yaml"
"""In the job's ConfigMap: the validated TrainingJob every supervisor reads."""
CONFIG_POLICY_FILE: Final = "policy.py"
"""In the job's ConfigMap (an inline policy), and the key a user's policy ConfigMap must use."""
CONFIG_USER_POLICY_DIR: Final = "user-policy"
"""Under CONFIG_DIR: where a user's policy ConfigMap (`spec.policy.configMap`) is mounted."""
ENV_CREDENTIALS_DIR: Final = "SLICEKEEPER_CREDENTIALS_DIR"
"""Where the job's credentials Secret is mounted (slicekeeper.credentials): its supervisors' TLS."""
CREDENTIALS_DIR: Final = "/var/run/slicekeeper/credentials"
ENV_JOB_UID: Final = "SLICEKEEPER_JOB_UID"
"""The TrainingJob's uid (set by the operator on every pod): the job's Lease, the one object its
supervisors create, names the job as its owner, so the garbage collector deletes it with the job."""
TRAININGJOB_API_VERSION: Final = "slicekeeper.dev/v1alpha1"
TRAININGJOB_KIND: Final = "TrainingJob"
ENV_POD_NAME: Final = "POD_NAME"
ENV_POD_NAMESPACE: Final = "POD_NAMESPACE"
ENV_POD_UID: Final = "POD_UID"
"""The pod's uid (downward API): its supervisor's writes to its pod carry it, so a supervisor whose pod
was replaced while it lived on (its node cut off from the API server) cannot write its successor's."""
"""The supervisor's own pod (downward API): the only object it ever writes to, to mark it."""
ENV_POD_IP: Final = "POD_IP"
"""The pod's IP (downward API): the supervisor binds its servers there and peers reach them there."""
ENV_NODE_NAME: Final = "NODE_NAME"
"""The node the pod runs on (downward API): the machine in the supervisor's reports."""
ANNOTATION_REPLACE: Final = "slicekeeper.dev/replace"
"""On a pod, by its own supervisor: replace this pod (the value says why); the operator acts on it."""
ANNOTATION_STATUS: Final = "slicekeeper.dev/status"
"""On the leader's pod, by its supervisor: the job's progress as JSON, copied into the job's status."""
ANNOTATION_NOTICE: Final = "slicekeeper.dev/notice"
"""On a pod, by the operator: the machine under it will go (a node's scheduled maintenance, an
impending termination), as JSON {"kind": "maintenance" | "preemption", "at": Unix seconds when it goes,
"source": the signal read}; the pod's supervisor tells the job's leader, which saves and replaces it
ahead of time (supervisor.host.notices)."""
LABEL_JOB: Final = "slicekeeper.dev/job"
"""The job an object belongs to: on its pods and Service (the operator), and on its Lease (the
supervisors), which the admission policy (charts/slicekeeper/templates/admission.yaml) lets only the
job's own pods write."""
EXIT_JOB_FAILED: Final = 1
"""A pod's supervisor exit codes are what the operator reads of it (operator/pod_actions.py): 1 means the
job failed as a whole (its policy or budgets said so): mark the job Failed, replace nothing."""
EXIT_RETIRED: Final = 3
"""The leader retired this host while it was alive (a straggler, a crash loop): replace this pod."""
EXIT_LEADER_UNREACHABLE: Final = 4
"""The leader could not be reached within spec.health.replacementTimeoutSeconds: replace this pod,
without blaming its node (supervisor/leader_connection.py)."""
SUPERVISOR_PORT: Final = 8490
RELAY_PORT: Final = 8491
"""In a pod: where a supervisor relays its group's members to the leader (spec.controlPlane.relays)."""
"""In a pod: the port the leader's supervisor listens on for its peers."""
METRICS_PORT: Final = 9464
"""In a pod: the supervisor's Prometheus endpoint."""


class Phase(StrEnum):
    """What a workload reports it is doing between steps; each maps to a badput category."""

    TPU_INITIALIZATION = "tpu_initialization"
    TRAINING_PREP = "training_prep"
    PROGRAM_STARTUP = "program_startup"
    DATA_LOADING = "data_loading"
    CHECKPOINT_SAVE = "checkpoint_save"
    CHECKPOINT_RESTORE = "checkpoint_restore"
    TEARDOWN = "teardown"
    """After the last step: final checkpoint writes, a final gather, shutting down."""
    IDLE = "idle"
    """Between steps, outside any reported phase."""
    HELD = "held"
    """Saved on a notice of a machine's loss, the workload waits to be stopped and handed over."""


class Event(StrEnum):
    """Message types a workload sends to its supervisor."""

    HELLO = "hello"
    PHASE = "phase"
    STEP_BEGIN = "step_begin"
    WORK_DONE = "work_done"
    """The step's own work is done; the host now waits for the others (names a hang's culprit)."""
    STEP_END = "step_end"
    CHECKPOINT_SAVED = "checkpoint_saved"
    CHECKPOINT_FAILED = "checkpoint_failed"
    CHECKPOINT_RESTORED = "checkpoint_restored"
    PROGRAMS = "programs"
    """Where this start's compiled programs came from: `loaded` (compiled by an earlier start) and
    `compiled` (names); the report shows which hosts of a restart compiled anything."""
    DONE = "done"


SAVE_AT = "save_at"
"""Supervisor -> workload: `{"type": "save_at", "step": S}`: a notice of this job's loss of a machine
came; save step S whatever the interval, then hold (Phase.HELD) until stopped. Read by the SDK at
each step's begin (workload.sdk.Session.save_requested)."""

GO = "go"
"""Supervisor -> standby workload: `{"type": "go", "env": {...}}`, the generation's variables.

A standby process is started ahead of need with the host's static environment; it imports its
libraries, connects, says hello with `standby: true`, and blocks. At the next restart the supervisor
sends `go` with the variables that belong to that generation (ENV_GENERATION, ENV_COORDINATOR,
ENV_RESTORE_STEP) instead of starting a process from scratch.
"""


CONTROL_LINE_LIMIT = 1 << 24
"""Bytes one leader <-> member line may take (asyncio's default is 64 KiB): the leader's journal,
which grows with the job's history, travels as one line."""


SDK_LINE_LIMIT = 1 << 16
"""Bytes one line from a workload to its supervisor may take (an event takes a few hundred): a longer
line ends the workload's connection."""


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def decode(line: bytes | str) -> dict[str, Any]:
    """The message on `line`; ValueError for anything else (a line nested too deeply for the parser
    included: its RecursionError must not pass for a bug of the reader's)."""
    try:
        value = json.loads(line)
    except RecursionError:
        raise ValueError(f"nested too deeply to be a slicekeeper message: {line[:80]!r}") from None
    if not isinstance(value, dict) or "type" not in value:
        raise ValueError(f"not a slicekeeper message: {line[:80]!r}")  # its start: it is logged
    return value
