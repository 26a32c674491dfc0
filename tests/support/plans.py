"""A job plan as the local runtime or a pod would make it, for tests of what a host's supervisor derives
from its plan (its workload's environment, its site)."""

from __future__ import annotations

from pathlib import Path

from slicekeeper.supervisor.plan import JobPlan

from slicekeeper.api import EnvVar, load_training_job
from slicekeeper.shape import JobLayout, JobShape
from tests.support.cli_runs import ROOT

EXAMPLE = ROOT / "examples" / "trainingjob.yaml"
"""tiny-lm: 2 slices x 2 hosts."""


def example_plan(tmp_path: Path, *, local: bool) -> JobPlan:
    job = load_training_job(EXAMPLE)
    workload = job.spec.workload.model_copy(update={"env": [EnvVar(name="FROM_THE_SPEC", value="yes")]})
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"workload": workload})})
    return JobPlan(
        training_job=job,
        layout=JobLayout(job.metadata.name, JobShape(2, 2, 2 if local else 4)),
        run_dir=str(tmp_path / "run"),
        leader="127.0.0.1:1" if local else "tiny-lm-s0-w0.tiny-lm:8475",
        total_steps=200,
        checkpoint_root=str(tmp_path / "disk"),
        compilation_cache=str(tmp_path / "cache") if local else None,
        local=local,
    )
