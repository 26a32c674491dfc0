"""The plan is a value: a supervisor's process validates its TrainingJob once, where the plan is read
(plan.json locally, the job's ConfigMap in a pod), and every part after that reads the model it holds;
the served host computes its workload's environment from three values it holds and hands it down,
instead of being called back with a dozen and a half of them (supervisor/plan.py,
supervisor/pod/pod_plan.py, supervisor/host/workload.py)."""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from slicekeeper.operator.render import render
from slicekeeper.supervisor import messages
from slicekeeper.supervisor.host import HostSupervisor
from slicekeeper.supervisor.host.served_host import ServedHost
from slicekeeper.supervisor.host.workload import Workloads, workload_env
from slicekeeper.supervisor.plan import JobPlan
from slicekeeper.supervisor.pod.pod_plan import pod_plan

from slicekeeper import protocol
from slicekeeper.api import TrainingJob, load_training_job
from slicekeeper.credentials import generate
from tests.support.plans import EXAMPLE, example_plan


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every TrainingJob validated from here on (each parse of one goes through the model's
    `model_validate`: slicekeeper.api.parse_training_job, load_training_job)."""
    seen: list[Any] = []
    validate = TrainingJob.model_validate

    def counted(document: Any, *args: Any, **kwargs: Any) -> TrainingJob:
        seen.append(document)
        return validate(document, *args, **kwargs)

    monkeypatch.setattr(TrainingJob, "model_validate", counted)
    return seen


def config_dir(tmp_path: Path, config_map: dict[str, Any]) -> Path:
    """The job's ConfigMap as the kubelet mounts it: one file per key."""
    folder = tmp_path / "config"
    folder.mkdir()
    for key, value in config_map["data"].items():
        (folder / key).write_text(value)
    return folder


def pod_env(pod: dict[str, Any], config: Path) -> dict[str, str]:
    """The variables of the pod's container that pod_plan reads (all of them literal values)."""
    env = {v["name"]: v["value"] for v in pod["spec"]["containers"][0]["env"] if "value" in v}
    return env | {protocol.ENV_CONFIG_DIR: str(config)}


def supervised(plan: JobPlan, tmp_path: Path) -> JobPlan:
    """The plan with folders of the test's own and the job's credentials."""
    credentials = generate(plan.training_job.metadata.name).write(tmp_path / "credentials")
    return replace(
        plan,
        run_dir=str(tmp_path / "run"),
        checkpoint_root=str(tmp_path / "disk"),
        credentials=str(credentials),
    )


def started(hosts: list[int], rank: int) -> messages.Start:
    return messages.Start(
        generation=1, coordinator="coordinator:1234", restore_step=None, world=hosts, rank=rank
    )


def test_a_pod_parses_its_training_job_once_from_its_config_map_to_its_workloads_environment(
    tmp_path, parses
):
    rendered = render(load_training_job(EXAMPLE))
    pod = list(rendered.pods())[3]  # tiny-lm-s1-w1: host 3
    env = pod_env(pod, config_dir(tmp_path, rendered.config_map()))
    parses.clear()  # the operator's, in its own process
    plan, host = pod_plan(env, [])
    supervisor = HostSupervisor(supervised(plan, tmp_path), "node-a", host)
    assert len(parses) == 1, f"{len(parses)} parses of the TrainingJob in one supervisor's process"
    served = supervisor._mode
    assert isinstance(served, ServedHost) and served.identity == host == plan.layout.host(3)
    workload = served.workload_env(started([0, 1, 2, 3], 3))
    assert workload[protocol.ENV_TPU_WORKER_HOSTNAMES] == "tiny-lm-s1-w0.tiny-lm,tiny-lm-s1-w1.tiny-lm"
    assert plan.training_job is served.context.plan.training_job  # the model, handed on
    assert len(parses) == 1


def test_a_local_supervisor_parses_its_training_job_once_reading_its_plan(tmp_path, parses):
    written = replace(supervised(example_plan(tmp_path, local=True), tmp_path), run_key="tiny-lm/run-1")
    Path(written.run_dir).mkdir(parents=True)
    written.write(Path(written.run_dir) / "plan.json")
    parses.clear()
    plan = JobPlan.read(Path(written.run_dir) / "plan.json")
    assert plan == written  # JSON at the edge only: what was written is read back whole
    supervisor = HostSupervisor(plan, "host-2", plan.layout.host(2))
    served = supervisor._mode
    assert isinstance(served, ServedHost)
    workload = served.workload_env(started([2, 3], 0))
    assert (workload[protocol.ENV_HOST], workload[protocol.ENV_NUM_HOSTS]) == ("2", "2")
    assert workload["FROM_THE_SPEC"] == "yes"
    assert len(parses) == 1, f"{len(parses)} parses of the TrainingJob in one supervisor's process"


def test_the_workloads_environment_is_three_values_the_served_host_holds_handed_down():
    assert list(inspect.signature(workload_env).parameters) == ["context", "start", "machine"]
    # Workloads is given each environment (launch, prestart); it has no callback to ask it of the host.
    assert "env" not in inspect.signature(Workloads).parameters
    assert list(inspect.signature(Workloads.launch).parameters) == ["self", "generation", "env"]
    assert list(inspect.signature(Workloads.prestart).parameters) == ["self", "env"]
