"""The workload SDK: a host's identity and world, from its environment or from the go that wakes a
standby, and the arguments it gives jax.distributed."""

import socket
import threading
import time

import pytest
from slicekeeper.supervisor.ports import free_port
from slicekeeper.workload import sdk
from slicekeeper.workload.sdk import HostIdentity, connect

from slicekeeper import protocol
from tests.support.fake_supervisor import env_for

# --- identity -------------------------------------------------------------------------------------


def test_identity_is_parsed_from_an_explicit_environment():
    identity = HostIdentity.from_env(
        {
            protocol.ENV_HOST: "3",
            protocol.ENV_NUM_HOSTS: "8",
            protocol.ENV_GENERATION: "5",
            protocol.ENV_COORDINATOR: "10.0.0.2:8476",
            protocol.ENV_RESTORE_STEP: "120",
            protocol.ENV_RESTORE_VERIFIED: "1",
            protocol.ENV_TOTAL_STEPS: "500",
            protocol.ENV_CHECKPOINT_DIR: "/dev/shm/sk/host-3",
            protocol.ENV_CHECKPOINT_INTERVAL: "25",
            protocol.ENV_CHECKPOINT_KEEP: "4",
            protocol.ENV_COMPILATION_CACHE: "/tmp/cache",
            protocol.ENV_TPU_WORKER_HOSTNAMES: "job-s0-w0,job-s0-w1,job-s0-w2,job-s0-w3",
        }
    )
    assert identity == HostIdentity(
        host=3,
        num_hosts=8,
        process_id=3,
        full_hosts=8,
        hosts_per_slice=4,
        generation=5,
        coordinator="10.0.0.2:8476",
        restore_step=120,
        restore_verified=True,
        total_steps=500,
        checkpoint_dir="/dev/shm/sk/host-3",
        checkpoint_interval=25,
        checkpoint_keep=4,
        compilation_cache="/tmp/cache",
    )


def test_a_host_takes_part_as_itself_in_the_full_world_unless_told_otherwise():
    identity = HostIdentity.from_env({protocol.ENV_HOST: "3", protocol.ENV_NUM_HOSTS: "4"})
    assert (identity.host, identity.process_id) == (3, 3)
    assert (identity.num_hosts, identity.full_hosts) == (4, 4)
    assert identity.hosts_per_slice == 4  # no TPU_WORKER_HOSTNAMES: one slice of every host


def test_after_a_scale_down_the_host_keeps_its_index_and_takes_a_rank_in_the_smaller_world():
    identity = HostIdentity.from_env(
        {
            protocol.ENV_HOST: "3",
            protocol.ENV_NUM_HOSTS: "2",
            protocol.ENV_PROCESS_ID: "1",
            protocol.ENV_FULL_HOSTS: "4",
        }
    )
    assert (identity.host, identity.process_id) == (3, 1)
    assert (identity.num_hosts, identity.full_hosts) == (2, 4)


@pytest.mark.parametrize("empty", [protocol.ENV_PROCESS_ID, protocol.ENV_FULL_HOSTS])
def test_an_empty_world_variable_falls_back_like_an_absent_one(empty):
    identity = HostIdentity.from_env({protocol.ENV_HOST: "2", protocol.ENV_NUM_HOSTS: "4", empty: ""})
    assert (identity.process_id, identity.full_hosts) == (2, 4)


def test_an_empty_restore_step_means_a_fresh_start():
    assert HostIdentity.from_env({protocol.ENV_RESTORE_STEP: ""}).restore_step is None
    assert HostIdentity.from_env({protocol.ENV_RESTORE_STEP: "0"}).restore_step == 0


def test_an_empty_environment_gives_a_single_host_fresh_start():
    identity = HostIdentity.from_env({})
    assert (identity.host, identity.num_hosts, identity.generation) == (0, 1, 0)
    assert identity.restore_step is None
    assert identity.restore_verified is False  # standalone: the loop verifies its own restores
    assert identity.coordinator is None
    assert identity.checkpoint_dir is None
    assert identity.compilation_cache is None
    assert (identity.total_steps, identity.checkpoint_interval, identity.checkpoint_keep) == (100, 10, 3)


def test_total_steps_come_from_the_identity():
    session = connect({protocol.ENV_TOTAL_STEPS: "42"})
    assert session.total_steps == 42


# --- jax.distributed ------------------------------------------------------------------------------


@pytest.fixture
def coordinator():
    """A listening coordinator's address."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield f"127.0.0.1:{server.getsockname()[1]}"


def test_with_a_coordinator_the_session_gives_jax_distributed_arguments(coordinator):
    session = connect(env_for(None, **{protocol.ENV_COORDINATOR: coordinator}))
    assert session.jax_distributed_args() == {
        "coordinator_address": coordinator,
        "num_processes": 4,
        "process_id": 1,
    }


def test_after_a_scale_down_jax_distributed_gets_the_smaller_world_and_the_rank_in_it(coordinator):
    session = connect(
        env_for(
            None,
            **{
                protocol.ENV_HOST: "3",
                protocol.ENV_NUM_HOSTS: "2",
                protocol.ENV_PROCESS_ID: "1",
                protocol.ENV_FULL_HOSTS: "4",
                protocol.ENV_COORDINATOR: coordinator,
            },
        )
    )
    assert session.jax_distributed_args() == {
        "coordinator_address": coordinator,
        "num_processes": 2,
        "process_id": 1,
    }


DISTRIBUTED_ARGS = {
    "jax": lambda session: session.jax_distributed_args()["coordinator_address"],
    "torch": lambda session: session.torch_distributed_args()["init_method"].removeprefix("tcp://"),
}
"""Each framework's arguments, reduced to the coordinator's address they name."""


@pytest.mark.parametrize("framework", DISTRIBUTED_ARGS)
def test_the_other_processes_get_their_arguments_once_the_coordinator_listens(framework):
    # A refused first connection costs JAX's gRPC client a 1 s reconnect backoff, and torch's
    # TCPStore client a backoff of its own: wait instead.
    port = free_port()  # below the ephemeral range: a client retrying early never meets itself
    address, listening = f"127.0.0.1:{port}", threading.Event()

    def listen_later() -> None:
        time.sleep(0.3)
        with socket.create_server(("127.0.0.1", port)) as server:
            listening.set()
            server.accept()[0].close()

    late = threading.Thread(target=listen_later)
    late.start()
    session = connect(env_for(None, **{protocol.ENV_COORDINATOR: address}))
    assert DISTRIBUTED_ARGS[framework](session) == address
    assert listening.is_set()  # it did not return before the coordinator listened
    late.join()


@pytest.mark.parametrize("framework", DISTRIBUTED_ARGS)
def test_process_0_starts_the_coordinator_and_does_not_wait_for_it(monkeypatch, framework):
    waited = []
    monkeypatch.setattr(sdk, "wait_for_listener", lambda *args: waited.append(args) or True)
    extra = {protocol.ENV_PROCESS_ID: "0", protocol.ENV_COORDINATOR: "127.0.0.1:9"}
    assert DISTRIBUTED_ARGS[framework](connect(env_for(None, **extra))) == "127.0.0.1:9"
    assert waited == []
    extra[protocol.ENV_PROCESS_ID] = "1"  # the control: another process waits
    DISTRIBUTED_ARGS[framework](connect(env_for(None, **extra)))
    assert waited == [("127.0.0.1:9", sdk.COORDINATOR_WAIT_SECONDS)]


def test_nobody_listening_gives_up_after_the_timeout_and_leaves_the_rest_to_jax():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"  # bound, never listening: refused
        assert sdk.wait_for_listener(address, timeout=0.2) is False


@pytest.mark.parametrize("coordinator", [None, ""])
def test_without_a_coordinator_jax_reads_its_own_variables(coordinator):
    extra = {} if coordinator is None else {protocol.ENV_COORDINATOR: coordinator}
    session = connect(env_for(None, **extra))
    assert session.jax_distributed_args() == {}


def test_a_standby_blocks_in_connect_until_go_and_takes_that_generation(tmp_path):
    import json
    import socket as socket_module
    import threading

    path = str(tmp_path / "sdk.sock")
    server = socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    received: list[dict] = []

    def supervisor() -> None:
        connection, _ = server.accept()
        stream = connection.makefile("rb")
        received.append(json.loads(stream.readline()))  # the standby hello
        go = {
            "SLICEKEEPER_GENERATION": "3",
            "SLICEKEEPER_COORDINATOR": "127.0.0.1:9",
            "SLICEKEEPER_RESTORE_STEP": "40",
        }
        connection.sendall(protocol.encode({"type": protocol.GO, "env": go}))
        received.append(json.loads(stream.readline()))  # the hello of generation 3
        connection.close()

    thread = threading.Thread(target=supervisor)
    thread.start()
    env = {"SLICEKEEPER_SOCKET": path, "SLICEKEEPER_STANDBY": "1", "SLICEKEEPER_HOST": "2"}
    session = connect(env)
    thread.join(5)
    assert received[0]["standby"] is True
    assert (session.identity.generation, session.identity.restore_step) == (3, 40)
    assert session.identity.coordinator == "127.0.0.1:9" and session.identity.host == 2
    assert received[1]["type"] == "hello" and received[1]["generation"] == 3
    session.close()
    server.close()
