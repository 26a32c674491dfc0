"""What a workload finds in its environment, as the pure functions of supervisor/host/workload.py
compute it from the host's context, the leader's start and the machine: locally and in a pod, after a
scale-down, and for a standby process promoted with `go`."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.host.site import site_of
from slicekeeper.supervisor.host.workload import (
    WorkloadMachine,
    go_env,
    standby_env,
    workload_argv,
    workload_env,
)
from slicekeeper.supervisor.plan import JobPlan
from slicekeeper.workload.sdk import HostIdentity

from slicekeeper import protocol
from tests.support.host_contexts import host_context
from tests.support.plans import example_plan


def env_of(
    plan: JobPlan,
    host: int,
    *,
    world: list[int] | None = None,
    rank: int | None = None,
    generation: int = 0,
    restore_step: int | None = None,
    slow: str = "",
    environ: dict[str, str] | None = None,
    cores: list[int] | None = None,
) -> dict[str, str]:
    start = messages.Start(
        generation=generation,
        coordinator="coordinator:1234",
        restore_step=restore_step,
        world=list(range(plan.shape.host_count)) if world is None else world,
        rank=host if rank is None else rank,
    )
    machine = WorkloadMachine(
        socket=Path("/run/sdk.sock"),
        temp_dir=Path("/run/tmp"),
        checkpoint_dir=Path("/disk/local"),
        cores=[0, 1] if cores is None else cores,
        environ={"PATH": "/usr/bin", "XLA_FLAGS": "--xla_dump_to=/tmp/x"} if environ is None else environ,
        slow=slow,
    )
    return workload_env(host_context(plan=plan, host=host), start, machine)


def test_a_local_workload_knows_its_host_its_slice_and_runs_on_cpu_devices_with_a_core_of_its_own(tmp_path):
    env = env_of(example_plan(tmp_path, local=True), 3, restore_step=20, slow="2.0@30")
    assert env["PATH"] == "/usr/bin" and env["FROM_THE_SPEC"] == "yes"
    assert (env[protocol.ENV_HOST], env[protocol.ENV_PROCESS_ID], env[protocol.ENV_NUM_HOSTS]) == (
        "3",
        "3",
        "4",
    )
    assert env[protocol.ENV_FULL_HOSTS] == "4" and env[protocol.ENV_TOTAL_STEPS] == "200"
    assert (env[protocol.ENV_GENERATION], env[protocol.ENV_COORDINATOR]) == ("0", "coordinator:1234")
    assert (env[protocol.ENV_RESTORE_STEP], env[protocol.ENV_RESTORE_VERIFIED]) == ("20", "1")
    assert env[protocol.ENV_CHAOS_SLOW] == "2.0@30"
    assert (env[protocol.ENV_SOCKET], env[protocol.ENV_CHECKPOINT_DIR]) == ("/run/sdk.sock", "/disk/local")
    assert (env[protocol.ENV_CHECKPOINT_INTERVAL], env[protocol.ENV_CHECKPOINT_KEEP]) == ("5", "3")
    assert env[protocol.ENV_COMPILATION_CACHE] == str(tmp_path / "cache")
    # Local host names: no Service to resolve them through, and JAX is given its coordinator.
    assert env[protocol.ENV_TPU_WORKER_HOSTNAMES] == "tiny-lm-s1-w0,tiny-lm-s1-w1"
    assert (env[protocol.ENV_TPU_WORKER_ID], env[protocol.ENV_TPU_NAME]) == ("1", "tiny-lm-s1")
    assert (env[protocol.ENV_MEGASCALE_NUM_SLICES], env[protocol.ENV_MEGASCALE_SLICE_ID]) == ("2", "1")
    assert protocol.ENV_MEGASCALE_COORDINATOR_ADDRESS not in env
    assert env[protocol.ENV_OWN_WORK_CORE] == "1"  # host 3 of 2 cores
    assert env[protocol.ENV_DEVICES_PER_HOST] == "2" and env["JAX_PLATFORMS"] == "cpu"
    assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=2"


def test_the_protocol_variables_win_over_the_supervisors_own_environment(tmp_path):
    environ = {protocol.ENV_HOST: "9", protocol.ENV_RESTORE_STEP: "7", "KEPT": "1"}
    env = env_of(example_plan(tmp_path, local=True), 2, environ=environ, cores=[])
    assert (env[protocol.ENV_HOST], env[protocol.ENV_RESTORE_STEP], env["KEPT"]) == ("2", "", "1")
    assert protocol.ENV_OWN_WORK_CORE not in env  # no core known: none assigned
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"


def test_in_a_pod_the_workload_reaches_its_peers_through_the_service_and_has_its_host_to_itself(tmp_path):
    env = env_of(example_plan(tmp_path, local=False), 3)
    assert env[protocol.ENV_TPU_WORKER_HOSTNAMES] == "tiny-lm-s1-w0.tiny-lm,tiny-lm-s1-w1.tiny-lm"
    assert env[protocol.ENV_MEGASCALE_COORDINATOR_ADDRESS] == "tiny-lm-s0-w0.tiny-lm"
    assert (env[protocol.ENV_MEGASCALE_NUM_SLICES], env[protocol.ENV_MEGASCALE_SLICE_ID]) == ("2", "1")
    for local_only in (protocol.ENV_OWN_WORK_CORE, protocol.ENV_DEVICES_PER_HOST, "JAX_PLATFORMS"):
        assert local_only not in env
    assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"  # real devices: the pod's flags as they are
    assert protocol.ENV_COMPILATION_CACHE not in env  # the plan has none


def test_after_a_scale_down_the_slices_taking_part_are_numbered_from_0_again(tmp_path):
    plan = example_plan(tmp_path, local=False)
    env = env_of(plan, 3, world=[2, 3], rank=1, generation=2)  # slice 0 dropped
    assert (env[protocol.ENV_MEGASCALE_NUM_SLICES], env[protocol.ENV_MEGASCALE_SLICE_ID]) == ("1", "0")
    assert env[protocol.ENV_MEGASCALE_COORDINATOR_ADDRESS] == "tiny-lm-s1-w0.tiny-lm"
    assert (env[protocol.ENV_NUM_HOSTS], env[protocol.ENV_PROCESS_ID]) == ("2", "1")
    # Which shard the host owns and the global batch's size do not change with the world.
    assert (env[protocol.ENV_HOST], env[protocol.ENV_FULL_HOSTS]) == ("3", "4")
    assert env[protocol.ENV_TPU_WORKER_HOSTNAMES] == "tiny-lm-s1-w0.tiny-lm,tiny-lm-s1-w1.tiny-lm"


def test_a_promoted_standby_sees_what_a_process_started_for_that_generation_would(tmp_path):
    for local in (True, False):
        plan = example_plan(tmp_path, local=local)
        before = env_of(plan, 3, generation=1, restore_step=10, slow="2.0@30")
        standby = standby_env(before)
        assert standby[protocol.ENV_STANDBY] == "1"
        for later in (protocol.ENV_GENERATION, protocol.ENV_COORDINATOR, protocol.ENV_RESTORE_STEP):
            assert later not in standby
        # Started while the full world trained; promoted after a scale-down, the slow fault fired.
        after = env_of(plan, 3, world=[2, 3], rank=1, generation=2, restore_step=20, slow="2.0@0")
        go = go_env(after, site_of(plan))
        assert {**standby, **go} == {**after, protocol.ENV_STANDBY: "1"}
        assert list(go)[:5] == [
            protocol.ENV_GENERATION,
            protocol.ENV_COORDINATOR,
            protocol.ENV_RESTORE_STEP,
            protocol.ENV_NUM_HOSTS,
            protocol.ENV_PROCESS_ID,
        ]
        assert list(go)[-2:] == [protocol.ENV_CHAOS_SLOW, protocol.ENV_CHAOS_HOLD]
        assert (protocol.ENV_MEGASCALE_COORDINATOR_ADDRESS in go) is not local


def test_go_carries_only_the_generations_variables_whatever_else_the_environment_holds(tmp_path):
    plan = example_plan(tmp_path, local=True)
    # Locally JAX is given its coordinator: a megascale address in the supervisor's own environment
    # is the standby's already, and not one of the generation's variables.
    env = env_of(plan, 1, environ={protocol.ENV_MEGASCALE_COORDINATOR_ADDRESS: "elsewhere", "OTHER": "1"})
    go = go_env(env, site_of(plan))
    assert protocol.ENV_MEGASCALE_COORDINATOR_ADDRESS not in go and "OTHER" not in go
    assert go == {
        protocol.ENV_GENERATION: "0",
        protocol.ENV_COORDINATOR: "coordinator:1234",
        protocol.ENV_RESTORE_STEP: "",
        protocol.ENV_NUM_HOSTS: "4",
        protocol.ENV_PROCESS_ID: "1",
        protocol.ENV_MEGASCALE_NUM_SLICES: "2",
        protocol.ENV_MEGASCALE_SLICE_ID: "0",
        protocol.ENV_CHAOS_SLOW: "",
        protocol.ENV_CHAOS_HOLD: "",
    }


def test_locally_python_is_the_supervisors_own_interpreter(tmp_path):
    local, pod = site_of(example_plan(tmp_path, local=True)), site_of(example_plan(tmp_path, local=False))
    workload = example_plan(tmp_path, local=True).training_job.spec.workload
    assert workload_argv(workload, local) == [
        sys.executable,
        "-m",
        "slicekeeper.workload.reference.jax_trainer",
        "--seed",
        "0",
    ]
    assert workload_argv(workload, pod)[0] == "python"
    assert workload_argv(workload.model_copy(update={"command": ["./train"]}), local)[0] == "./train"


def test_the_checkpoint_a_job_starts_from_reaches_every_workload_and_its_identity(tmp_path):
    plan = example_plan(tmp_path, local=True)
    assert protocol.ENV_INIT_FROM not in env_of(plan, 1)  # none named: none set
    assert HostIdentity.from_env(env_of(plan, 1)).init_from is None
    job = plan.training_job
    workload = job.spec.workload.model_copy(update={"init_from": "/checkpoints/exported"})
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"workload": workload})})
    env = env_of(replace(plan, training_job=job), 1)
    assert env[protocol.ENV_INIT_FROM] == "/checkpoints/exported"
    assert HostIdentity.from_env(env).init_from == "/checkpoints/exported"
