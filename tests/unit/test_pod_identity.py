"""A supervisor in a pod knows who it is from what the operator rendered: the pod's environment and
the job's ConfigMap (render -> pod_plan round trip), and refuses to start when either is wrong."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from slicekeeper.operator.render import render
from slicekeeper.supervisor.pod.pod_plan import pod_plan

from slicekeeper import protocol
from slicekeeper.api import load_training_job, parse_training_job
from slicekeeper.errors import UserError
from tests.support.cli_runs import ROOT

EXAMPLE = ROOT / "examples" / "trainingjob.yaml"
POLICY = "from slicekeeper.policy import Ignore\n\n\ndef on_straggler(event, context):\n    return Ignore()\n"


def mounted(tmp_path: Path, config_map: dict[str, Any]) -> Path:
    """The ConfigMap as the kubelet mounts it: one file per key."""
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    for key, value in config_map["data"].items():
        (config_dir / key).write_text(value)
    return config_dir


def pod_env(pod: dict[str, Any], config_dir: Path) -> dict[str, str]:
    """The container's environment as the kubelet sets it, downward API included."""
    env = {}
    for variable in pod["spec"]["containers"][0]["env"]:
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        else:
            path = variable["valueFrom"]["fieldRef"]["fieldPath"]
            env[variable["name"]] = pod["metadata"]["name"] if path == "metadata.name" else "research"
    return env | {protocol.ENV_CONFIG_DIR: str(config_dir)}


def test_every_rendered_pod_finds_its_host_its_leader_and_its_workload(tmp_path):
    job = load_training_job(EXAMPLE)
    rendered = render(job)
    config_dir = mounted(tmp_path, rendered.config_map())
    for pod in rendered.pods():
        plan, host = pod_plan(pod_env(pod, config_dir), pod["spec"]["containers"][0]["args"])
        assert str(host.index) == pod["metadata"]["labels"]["slicekeeper.dev/host"]
        assert host == plan.layout.host(host.index)
        assert plan.leader == f"tiny-lm-s0-w0.tiny-lm:{protocol.SUPERVISOR_PORT}"
        assert not plan.local and plan.metrics_port == protocol.METRICS_PORT
        assert (plan.shape.slices, plan.shape.hosts_per_slice, plan.shape.devices_per_host) == (
            2,
            2,
            4,
        )  # v5p-16: 4 chips a host
        assert plan.checkpoint_root == job.spec.checkpoint.local_dir
        mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
        assert plan.compilation_cache == mounts["compilation-cache"]  # kept across workload restarts
        assert plan.run_key == "research/tiny-lm"
        spec = plan.training_job.spec
        assert spec.workload.command == pod["spec"]["containers"][0]["args"] and spec.workload.args == []
        assert spec.checkpoint == job.spec.checkpoint and spec.health == job.spec.health


def test_an_inline_policy_in_the_config_map_is_the_policy_the_supervisor_loads(tmp_path):
    job = load_training_job(EXAMPLE)
    rendered = render(job, POLICY)
    config_dir = mounted(tmp_path, rendered.config_map())
    plan, _ = pod_plan(pod_env(next(rendered.pods()), config_dir), [])
    assert plan.training_job.spec.policy.file == str(config_dir / "policy.py")
    assert plan.training_job.spec.workload.command == job.spec.workload.command  # no args: the job's


def test_a_users_policy_config_map_is_read_where_the_pod_mounts_it(tmp_path):
    document = load_training_job(EXAMPLE).model_dump(mode="json", by_alias=True, exclude_none=True)
    document["spec"]["policy"] = {"configMap": "my-policy"}
    rendered = render(parse_training_job(document))
    config_dir = mounted(tmp_path, rendered.config_map())
    env = pod_env(next(rendered.pods()), config_dir)
    with pytest.raises(UserError, match="my-policy"):
        pod_plan(env, [])
    (config_dir / "user-policy").mkdir()
    (config_dir / "user-policy" / "policy.py").write_text(POLICY)
    plan, _ = pod_plan(env, [])
    assert plan.training_job.spec.policy.file == str(config_dir / "user-policy" / "policy.py")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({protocol.ENV_HOST: ""}, "SLICEKEEPER_HOST is not set"),
        ({protocol.ENV_HOST: "x"}, "SLICEKEEPER_HOST='x' is not a whole number"),
        ({protocol.ENV_HOST: "4"}, "SLICEKEEPER_HOST=4: the job has hosts 0..3"),
        ({protocol.ENV_TPU_WORKER_ID: "1"}, "TPU_WORKER_ID=1 does not match SLICEKEEPER_HOST=0"),
    ],
)
def test_a_pod_with_a_wrong_identity_is_refused_naming_the_variable(tmp_path, change, message):
    rendered = render(load_training_job(EXAMPLE))
    env = pod_env(next(rendered.pods()), mounted(tmp_path, rendered.config_map())) | change
    with pytest.raises(UserError) as refused:
        pod_plan(env, [])
    assert message in str(refused.value)


def test_the_pod_entrypoint_exits_2_naming_a_missing_config_map(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        protocol.ENV_CONFIG_DIR: str(tmp_path / "nothing"),
        protocol.ENV_HOST: "0",
    }
    result = subprocess.run(
        [sys.executable, "-m", "slicekeeper.supervisor", "--in-pod", "--", "python", "train.py"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert "trainingjob.yaml" in result.stderr and "Traceback" not in result.stderr


def test_in_a_pod_the_workload_reaches_its_peers_through_the_service_and_sees_the_current_world(tmp_path):
    from dataclasses import replace

    from slicekeeper.supervisor import messages
    from slicekeeper.supervisor.host import HostSupervisor

    from slicekeeper.credentials import generate

    rendered = render(load_training_job(EXAMPLE))
    pod = list(rendered.pods())[3]  # tiny-lm-s1-w1: host 3
    plan, host = pod_plan(pod_env(pod, mounted(tmp_path, rendered.config_map())), [])
    credentials = generate("tiny-lm").write(tmp_path / "credentials")  # the job's Secret, mounted
    plan = replace(
        plan,
        run_dir=str(tmp_path / "run"),
        checkpoint_root=str(tmp_path / "disk"),
        credentials=str(credentials),
    )
    supervisor = HostSupervisor(plan, f"host-{host.index}", host)
    served = supervisor._mode  # the host it serves (supervisor.host.served_host)
    start = messages.Start(
        generation=1, coordinator="tiny-lm-s0-w0.tiny-lm:8476", restore_step=None, world=[0, 1, 2, 3], rank=3
    )
    env = served.workload_env(start)
    assert env["TPU_WORKER_HOSTNAMES"] == "tiny-lm-s1-w0.tiny-lm,tiny-lm-s1-w1.tiny-lm"
    assert (env["MEGASCALE_NUM_SLICES"], env["MEGASCALE_SLICE_ID"]) == ("2", "1")
    assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "tiny-lm-s0-w0.tiny-lm"
    assert protocol.ENV_OWN_WORK_CORE not in env  # a pod has its host to itself

    start = start.model_copy(  # slice 0 dropped by a scale-down
        update={"generation": 2, "coordinator": "tiny-lm-s1-w0.tiny-lm:8476", "world": "2-3", "rank": 1}
    )
    env = served.workload_env(start)
    assert (env["MEGASCALE_NUM_SLICES"], env["MEGASCALE_SLICE_ID"]) == ("1", "0")
    assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "tiny-lm-s1-w0.tiny-lm"
    assert (env["SLICEKEEPER_NUM_HOSTS"], env["SLICEKEEPER_PROCESS_ID"]) == ("2", "1")
