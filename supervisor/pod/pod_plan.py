"""A supervisor in a TPU pod: its plan from the pod's environment and the job's ConfigMap.

The operator renders every pod with its identity in the environment (`SLICEKEEPER_HOST`, the TPU_*
and MEGASCALE_* variables, `POD_NAME`) and mounts the job's ConfigMap (the validated TrainingJob and
the policy) at `SLICEKEEPER_CONFIG_DIR` (operator/render.py). This module turns both into the same
JobPlan the local runtime writes, so that one HostSupervisor serves both worlds: the ConfigMap's
TrainingJob is parsed here, the pod's one parse, and handed on as the model with its layout and the
host's identity checked against it. Anything missing or inconsistent is a UserError naming the
variable or file: a pod that cannot know who it is must not start training.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from slicekeeper.supervisor.plan import JobPlan

from slicekeeper import protocol
from slicekeeper.api import TrainingJob, cluster_layout, load_training_job
from slicekeeper.errors import UserError
from slicekeeper.shape import HostId

POLICY_FILES = (
    protocol.CONFIG_POLICY_FILE,
    f"{protocol.CONFIG_USER_POLICY_DIR}/{protocol.CONFIG_POLICY_FILE}",
)
"""Where a pod finds its policy: stored by the operator, or the user's own ConfigMap mounted."""
RUN_DIR = "/tmp/slicekeeper"
"""Logs, the SDK socket and the supervisor's report, inside the container."""


def _variable(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "")
    if not value:
        raise UserError(
            f"{name} is not set: the pod's environment comes from the operator (operator/render.py)"
        )
    return value


def _whole(env: Mapping[str, str], name: str) -> int:
    text = _variable(env, name)
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{name}={text!r} is not a whole number") from None


def _with_policy_file(job: TrainingJob, config_dir: Path) -> TrainingJob:
    found = [config_dir / name for name in POLICY_FILES if (config_dir / name).is_file()]
    if not found:
        if job.spec.policy.config_map is not None:
            raise UserError(
                f"spec.policy.configMap {job.spec.policy.config_map!r}: no policy.py in it "
                f"(looked in {config_dir / POLICY_FILES[1]})"
            )
        policy = job.spec.policy.model_copy(update={"file": None, "source": None})
    else:
        policy = job.spec.policy.model_copy(
            update={"file": str(found[0]), "source": None, "config_map": None}
        )
    return job.model_copy(update={"spec": job.spec.model_copy(update={"policy": policy})})


def pod_plan(env: Mapping[str, str], command: list[str]) -> tuple[JobPlan, HostId]:
    """The plan of the pod whose environment is `env`, and the host it serves.

    `command` (the pod's args: the user's command) replaces the job's workload command when given.
    """
    config_dir = Path(env.get(protocol.ENV_CONFIG_DIR) or protocol.CONFIG_DIR)
    job = _with_policy_file(load_training_job(config_dir / protocol.CONFIG_JOB_FILE), config_dir)
    if command:
        workload = job.spec.workload.model_copy(update={"command": command, "args": []})
        job = job.model_copy(update={"spec": job.spec.model_copy(update={"workload": workload})})
    layout = cluster_layout(job)
    host = _whole(env, protocol.ENV_HOST)
    host_count = layout.shape.host_count
    if not 0 <= host < host_count:
        raise UserError(f"{protocol.ENV_HOST}={host}: the job has hosts 0..{host_count - 1}")
    identity = layout.host(host)
    worker = _whole(env, protocol.ENV_TPU_WORKER_ID)
    if worker != identity.worker:
        raise UserError(
            f"{protocol.ENV_TPU_WORKER_ID}={worker} does not match {protocol.ENV_HOST}={host} "
            f"(worker {identity.worker} of slice {identity.slice})"
        )
    leader = f"{layout.hostname(layout.host(0))}.{job.metadata.name}"  # the headless Service's name
    namespace = env.get(protocol.ENV_POD_NAMESPACE) or job.metadata.namespace or "default"
    plan = JobPlan(
        training_job=job,
        layout=layout,
        run_dir=RUN_DIR,
        leader=f"{leader}:{protocol.SUPERVISOR_PORT}",
        total_steps=job.spec.workload.steps,
        checkpoint_root=job.spec.checkpoint.local_dir,
        compilation_cache=protocol.COMPILATION_CACHE_DIR,
        local=False,
        metrics_port=protocol.METRICS_PORT,
        run_key=f"{namespace}/{job.metadata.name}",
        address=env.get(protocol.ENV_POD_IP) or None,
        replacement_timeout=job.spec.health.replacement_timeout_seconds,
        credentials=env.get(protocol.ENV_CREDENTIALS_DIR) or protocol.CREDENTIALS_DIR,
    )
    return plan, identity
