"""The leader in a cluster: a lost host's replacement is a new pod with the same identity.

The operator re-creates a lost pod; its supervisor registers as the same host. The leader holds the
job stopped until it does (a hot-swap), or until `replacement_timeout` passes: then the policy decides
again with no spare (by default: drop the host's slice), and the pod joining later brings the slice
back (scale-up). A real Leader over TCP with fake members, two slices of two hosts.
"""

import asyncio
import contextlib

from slicekeeper.supervisor.leader import Leader
from slicekeeper.supervisor.leader.capacity import pod_replacements
from slicekeeper.supervisor.leader.restart_state import JobState
from slicekeeper.supervisor.leader.settings import LeaderSettings

from slicekeeper.shape import JobShape
from tests.support.fake_members import Member, coordinator, eventually, join, run

TIMEOUT = 0.5


async def cluster_job(replacement_timeout: float = TIMEOUT) -> tuple[Leader, list[Member], int]:
    leader = Leader(
        LeaderSettings(JobShape(2, 2, 2), 10), coordinator, replacements=pod_replacements(replacement_timeout)
    )
    port = await leader.serve("127.0.0.1", 0)
    members = await join(port, 4)
    for member in members:
        await member.send("register", replica_address=f"pod-{member.host}:1", machine=f"node-{member.host}")
    for member in members:
        assert (await member.receive())["type"] == "start"
    for member in members:
        await member.progress(0, step=10, t=100.0)
        await member.send("checkpoint", step=10)
    await eventually(lambda: all(s.committed == {10} for s in leader.status.values()))
    return leader, members, port


async def lose_host_3(members: list[Member]) -> None:
    members[3].close()
    for member in members[:3]:
        assert (await member.receive())["type"] == "stop"
    for member in members[:3]:
        # Host 1 (slice 0) keeps its twin's shard, host 3's, as a peer replica.
        replicas = {"3": [10]} if member.host == 1 else {}
        await member.send("stopped", generation=0, committed=[10], replicas=replicas)


async def new_pod(port: int, host: int, node: str) -> Member:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    pod = Member(host, reader, writer)
    await pod.send("register", replica_address=f"new-pod-{host}:1", machine=node)
    return pod


def test_a_lost_pod_is_awaited_and_its_replacement_takes_over_the_host():
    async def scenario():
        leader, members, port = await cluster_job(replacement_timeout=30)
        await lose_host_3(members)
        await eventually(lambda: leader.status[3].state == "awaiting replacement")
        assert leader.memory.state is JobState.STOPPING  # held: no start without host 3
        replacement = await new_pod(port, 3, "node-9")
        everyone = [*members[:3], replacement]
        starts = [await m.receive() for m in everyone]
        for rank, start in enumerate(starts):
            assert (start["type"], start["generation"], start["restore_step"]) == ("start", 1, 10)
            assert (start["world"], start["rank"]) == ("0-3", rank)
        assert starts[0]["replica_addresses"]["3"] == "new-pod-3:1"
        # Host 3's shard comes from its peer replica on host 1 (the new pod holds nothing yet).
        assert next((s["tier"], s.get("holder")) for s in starts[3]["sources"]) == ("peer", 1)
        assert leader.memory.hot_swaps == [{"host": 3, "spare": None, "machine": "node-9", "generation": 0}]
        status = leader.cluster_status()
        assert (status["slicesActive"], status["hotSwaps"], status["awaitingReplacement"]) == (2, 1, [])
        assert status["restarts"] == {"host_lost": 1} and status["lastCheckpointStep"] == 10
        # The restart the TrainingJob's status shows: the lost host's pod, step 10, none trained again.
        assert status["lastRestore"] == {
            "generation": 1,
            "cause": "host_lost",
            "step": 10,
            "stepsReplayed": 0,
        }
        for member in everyone:
            member.close()
        await leader.close()

    run(scenario)


def test_no_replacement_in_time_drops_the_slice_and_its_late_pod_brings_it_back():
    async def scenario():
        leader, members, port = await cluster_job()
        await lose_host_3(members)
        # No pod for host 3 within the timeout: the policy, told there is no spare, scales down.
        starts = [await m.receive() for m in members[:2]]
        assert [(s["type"], s["world"]) for s in starts] == [("start", "0-1"), ("start", "0-1")]
        assert (await members[2].receive())["type"] == "park"
        assert leader.cluster_status()["slicesActive"] == 1
        decisions = [(d["event"]["kind"], d["action"]["name"]) for d in leader.summary()["decisions"]]
        assert decisions == [("host_lost", "replace"), ("host_lost", "scale_down")]
        for member in members[:2]:
            await member.progress(1, step=12, t=200.0)
        # Capacity came back: the replacement pod is scheduled at last and registers as host 3.
        late = await new_pod(port, 3, "node-9")
        for member in members[:2]:
            assert (await member.receive())["type"] == "stop"
        for member in members[:2]:
            await member.send("stopped", generation=1, committed=[10])
        everyone = [*members[:3], late]
        starts = [await m.receive() for m in everyone]
        assert [(s["type"], s["generation"], s["world"]) for s in starts] == [("start", 2, "0-3")] * 4
        assert leader.cluster_status()["slicesActive"] == 2
        assert [e["kind"] for e in leader.summary()["scale_events"]] == ["down", "up"]
        for member in everyone:
            member.close()
        await leader.close()

    run(scenario)


def test_a_lost_host_whose_own_pod_comes_back_is_no_longer_awaited():
    """A host lost only to its leader (e.g. the old leader's pod, paused until another host's supervisor
    led) lives on, and the operator makes no new pod for it: its own supervisor rejoining ends the wait,
    and the job goes on with every slice instead of being scaled down when the wait times out."""

    async def scenario():
        leader, members, port = await cluster_job()
        await lose_host_3(members)
        await eventually(lambda: leader.status[3].state == "awaiting replacement")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        back = Member(3, reader, writer)
        await back.send("register", generation=0, step=10, replica_address="pod-3:1", machine="node-3")
        assert (await back.receive())["type"] == "stop"
        await back.send("stopped", generation=0, committed=[10])
        everyone = [*members[:3], back]
        starts = [await m.receive() for m in everyone]
        assert [(s["type"], s["generation"], s["world"]) for s in starts] == [("start", 1, "0-3")] * 4
        assert next(s["tier"] for s in starts[3]["sources"]) == "local"  # its own disk, intact
        await asyncio.sleep(3 * TIMEOUT)  # the wait's timeout would have passed by now
        decisions = [(d["event"]["kind"], d["action"]["name"]) for d in leader.summary()["decisions"]]
        assert decisions == [("host_lost", "replace")]
        status = leader.cluster_status()
        assert (status["slicesActive"], status["hotSwaps"], status["awaitingReplacement"]) == (2, 0, [])
        for member in everyone:
            member.close()
        await leader.close()

    run(scenario)


def test_a_pod_replaced_while_its_supervisor_lives_on_is_told_to_retire_before_the_new_one_starts():
    """A node cut off from the API server goes NotReady; the operator replaces its pod elsewhere while
    the old pod's supervisor still reaches the leader. The new pod's registration retires the old
    supervisor (it stops its workload and ends) and closes its connection, before any start."""

    async def scenario():
        leader, members, port = await cluster_job(replacement_timeout=30)
        replacement = await new_pod(port, 3, "node-9")
        retire = await members[3].receive()
        assert (retire["type"], retire["reason"]) == (
            "retire",
            "host 3 was taken over by a new pod on node-9",
        )
        with contextlib.suppress(ConnectionError):  # then its connection ends
            assert await members[3].reader.read() == b""
        await eventually(lambda: leader.status[3].machine == "node-9")
        for member in [*members[:3], replacement]:
            member.close()
        await leader.close()

    run(scenario)


def test_a_pod_lost_before_the_job_started_is_awaited_not_failed():
    async def scenario():
        leader = Leader(
            LeaderSettings(JobShape(1, 2), 3), coordinator, replacements=pod_replacements(TIMEOUT)
        )
        port = await leader.serve("127.0.0.1", 0)
        members = await join(port, 2)
        await members[0].send("register", machine="node-0")
        members[1].close()  # connected, never registered: its pod went before it could
        await asyncio.sleep(0.1)
        again = await new_pod(port, 1, "node-7")
        assert (await members[0].receive())["type"] == "start"
        assert (await again.receive())["type"] == "start"
        assert leader.memory.state is JobState.RUNNING and leader.memory.hot_swaps == []
        for member in (members[0], again):
            member.close()
        await leader.close()

    run(scenario)


def test_a_pod_that_joins_after_the_job_finished_is_told_to_shut_down():
    async def scenario():
        leader, members, port = await cluster_job()
        for member in members:
            await member.send("finished", generation=0, step=40, fingerprint="f")
        for member in members:
            assert (await member.receive())["type"] == "shutdown"
        late = await new_pod(port, 3, "node-9")
        assert await late.receive() == {"type": "shutdown"}
        assert leader.memory.hot_swaps == []
        for member in [*members, late]:
            member.close()
        await leader.close()

    run(scenario)
