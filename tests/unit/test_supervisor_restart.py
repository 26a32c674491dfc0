"""A supervisor started again on its machine (chaos `crash-supervisor`): what the machine remembers,
and what the leader makes of the supervisor registering again.

The machine's record (supervisor/host/machine_record.py) keeps the host it serves and the chaos it
fired across its supervisor's death; the leader (driven over TCP with fake members,
tests/support/leader_jobs.py) stops the generation the restarted host missed as a crash, unless a
spare took that host over meanwhile, in which case the returning supervisor is retired.
"""

from __future__ import annotations

import asyncio

from slicekeeper.supervisor.host.chaos import faults_of, hang_holds
from slicekeeper.supervisor.host.machine_record import MachineRecord
from slicekeeper.supervisor.leader import Leader
from slicekeeper.supervisor.leader.capacity import pod_replacements
from slicekeeper.supervisor.leader.election import Holder
from slicekeeper.supervisor.leader.restart_state import JobState
from slicekeeper.supervisor.leader.settings import LeaderSettings

from slicekeeper.shape import JobShape
from tests.support.fake_members import Member, coordinator, eventually, join, run
from tests.support.leader_jobs import all_stop, assigned, job_with_spares, lose, running_job, shut

SPECS = ["crash-supervisor:host=1@step=5", "slow:host=1,factor=2@step=3", "kill:host=1@step=9"]


def test_a_machine_remembers_its_host_and_the_faults_it_fired_across_its_supervisors(tmp_path):
    record = MachineRecord.of(tmp_path)
    assert (record.host, record.fired, record.slow) == (None, [], None)  # a first start
    record.serve(1)
    record.fire("slow:host=1,factor=2@step=3", slow=2.0)
    record.fire("crash-supervisor:host=1@step=5")  # noted before the supervisor dies of it
    again = MachineRecord.of(tmp_path)  # the next supervisor on this machine
    assert (again.host, again.slow) == (1, 2.0)
    assert [str(f) for f in faults_of(SPECS, again.host, set(again.fired))] == ["kill:host=1@step=9"]
    # The negative control: without the record, the crash would fire again at step 5, at every start.
    assert len(faults_of(SPECS, 1, set())) == 3


async def restarted_registers(port: int, host: int, machine: str) -> Member:
    """The supervisor started again on `machine` joins the leader on a new connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    member = Member(host, reader, writer)
    await member.send(
        "register",
        metrics_port=9300 + host,
        replica_address=f"10.0.3.{host}:7100",
        machine=machine,
        restarted=True,
    )
    return member


def test_a_host_whose_supervisor_restarted_stops_the_generation_as_a_crash_and_serves_on():
    async def scenario():
        job = await job_with_spares(hosts=2, spares=1)
        old = job.members[1]
        port = job.leader._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        new = await restarted_registers(port, 1, "host-1")
        await all_stop([job.members[0], new], generation=0, kind="crash")
        assert await old.reader.read() == b""  # the dead supervisor's connection, closed by the leader
        assert "host 1's supervisor restarted on host-1" in await job.event("restarted")
        for member in (job.members[0], new):
            await member.send("stopped", generation=0)
        for member in (job.members[0], new):
            assert (await member.receive())["type"] == "start"
        summary = job.leader.summary()
        assert summary["restarts"] == {"crash": 1} and summary["hot_swaps"] == []  # no spare was needed
        assert job.leader.status[1].replica_address == "10.0.3.1:7100"
        job.members[1] = new
        await job.shut()

    run(scenario)


def test_a_restarted_supervisor_whose_host_a_spare_took_over_is_retired():
    async def scenario():
        job = await job_with_spares(hosts=2, spares=1)
        await lose(job, 1)  # the leader saw host 1's connection drop first: a spare takes it over
        await all_stop(job.members[:1], generation=0, kind="host_lost")
        await assigned(job.spares[0], host=1, generation=0, fired=["lose:host=1@step=5"])
        port = job.leader._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        late = await restarted_registers(port, 1, "host-1")
        retire = await late.receive()
        assert retire["type"] == "retire" and "taken over" in retire["reason"]
        await eventually(lambda: job.leader.status[1].machine == "spare-0")  # the spare serves on
        late.close()
        await job.shut()

    run(scenario)


def test_a_supervisor_restarted_during_a_restart_is_stopped_with_it_and_counts_no_second_restart():
    async def scenario():
        job = await job_with_spares(hosts=2, spares=1)
        await job.members[0].fault(0)  # a crash on host 0: every host stopping
        await all_stop(job.members, generation=0, kind="crash")
        port = job.leader._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        new = await restarted_registers(port, 1, "host-1")  # host 1's supervisor died meanwhile
        await all_stop([new], generation=0, kind="crash")
        await job.members[0].send("stopped", generation=0)
        await new.send("stopped", generation=0)
        for member in (job.members[0], new):
            assert (await member.receive())["type"] == "start"
        assert job.leader.summary()["restarts"] == {"crash": 1}
        job.members[1] = new
        await job.shut()

    run(scenario)


def test_a_new_machine_registering_first_with_a_new_leader_is_decided_on_with_every_member_back():
    """A host's new machine (here: host 0's replacement pod, which reaches the new leader first) stops
    the job on registering; the decision on it must see host 1, which comes back with the job's
    memory right after. Handled in arrival order, the decision found host 1 without a machine and
    failed the job (seen on the fake-kubelet cluster); members coming back are placed first."""

    async def scenario():
        old, members = await running_job(hosts=2)
        memory = {"type": "journal", "seq": 3, "journal": old.journal()}
        await shut(old, members)
        new = Leader(
            LeaderSettings(JobShape(1, 2), 3), coordinator, replacements=pod_replacements(10.0), term=2
        )
        port = await new.serve("127.0.0.1", 0)
        new.take_over(Holder("a-0", 0, "10.0.0.1:8475"), Holder("a-2", 0, f"127.0.0.1:{port}"), None, 100.0)
        fresh, back = await join(port, 2)
        await fresh.send("register", machine="a-2", metrics_port=9300)  # host 0's new pod, first
        await eventually(lambda: new._takeover is not None and 0 in new._takeover.hosts)
        await back.send("register", machine="a-1", metrics_port=9101, generation=0, step=4, journal=memory)
        for member in (fresh, back):
            stop = await member.receive()
            assert (stop["type"], stop["kind"]) == ("stop", "host_lost"), stop
        assert new.memory.state is JobState.STOPPING and new.memory.leader_changes[0]["from_host"] == 0
        await shut(new, [fresh, back])

    run(scenario)


def test_a_workload_is_told_the_steps_its_pending_hangs_stop_as_they_begin():
    """protocol.ENV_CHAOS_HOLD: the SDK waits at these steps' begin for the stop; a hang fired (the
    machine's record) or one inside the collective is not among them."""
    specs = [
        "hang:host=1@step=10",
        "hang:host=1,at=collective@step=12",
        "hang:host=1@step=22",
        "kill:host=1@step=5",
    ]
    assert hang_holds(faults_of(specs, 1, set())) == "10,22"
    assert hang_holds(faults_of(specs, 1, {"hang:host=1@step=10"})) == "22"
    assert hang_holds(faults_of(specs, 2, set())) == ""
