"""The job's memory is a value: written down as JSON and read back, nothing is lost or changed.

That is what lets a new leader carry on a job (supervisor.leader.journal). Checked on a memory with every
field filled in, and on the memory a real Leader built while driven through faults, a chaos record, a
restart with holdings and restores, and a failed persistent commit.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest
from slicekeeper.supervisor.leader import Leader
from slicekeeper.supervisor.leader.journal import Detection, FaultRecord, JobMemory
from slicekeeper.supervisor.leader.restart_state import JobState, RestartState
from slicekeeper.supervisor.leader.settings import LeaderSettings

from slicekeeper.shape import JobShape
from tests.support.fake_members import coordinator, eventually, join, run

JOB_PART = ("phase", "generation", "restarts", "restarts_without_progress", "failure_reason")


def through_json(memory: JobMemory) -> JobMemory:
    return JobMemory.from_json(json.loads(json.dumps(memory.to_json())))


def test_a_memory_with_every_field_filled_in_survives_json():
    memory = JobMemory(
        started_at=1000.0,
        restart=RestartState(phase=JobState.STOPPING, generation=3, restarts=3, restarts_without_progress=1),
        high_water=57,
        restarts=Counter({"crash": 2, "hang": 1}),
        stop_cause={"kind": "hang", "host": 2, "t": 1050.0, "high_water": 57, "planned": False},
        faults=[FaultRecord("kill", 1, 12, 1010.0, 0, detected_at=1010.2, detected_in_generation=0)],
        detections=[Detection("crash", 1, 0, 1010.2, "workload killed by SIGKILL", restore_step=10)],
        recoveries=[{"generation": 1, "cause": "crash", "held": {"local": {"0": [5, 10]}}}],
        restores=[{"host": 1, "step": 10, "tier": "peer", "holder": 3, "loaded_step": 10}],
        hot_swaps=[{"host": 1, "spare": 0, "machine": "spare-0", "generation": 1}],
        failed_saves=Counter({"persistent": 1}),
        job_invalid={30},
        persisted={60: {0, 1}},
        persistent_committed={25, 50},
        persistent_owners={25: {0, 1, 2, 3}, 50: {0, 1}},
        persistent_commits=[{"step": 25, "t": 1020.0}, {"step": 50, "t": 1040.0}],
    )
    assert through_json(memory) == memory
    assert memory.awaiting_resume() == memory.faults  # detected, not yet productive again


def test_a_memory_with_a_field_it_does_not_know_is_refused_by_name():
    data = JobMemory(started_at=1.0).to_json()
    data["budget_reset"] = True
    with pytest.raises(ValueError, match=r"unknown field.*budget_reset"):
        JobMemory.from_json(data)


def test_the_memory_a_leader_built_through_faults_and_restarts_survives_json():
    async def scenario():
        leader = Leader(LeaderSettings(JobShape(1, 2), 5), coordinator)
        members = await join(await leader.serve("127.0.0.1", 0), 2)
        for member in members:
            await member.send(
                "register", metrics_port=9100 + member.host, replica_address=f"10.0.1.{member.host}:7100"
            )
        [await m.receive() for m in members]  # start of generation 0
        await members[1].send("chaos", kind="kill", step=7, t=90.0, generation=0, fault="kill:host=1@step=7")
        for member in members:
            await member.progress(0, 7, t=95.0)
        await members[1].fault(0, kind="crash", t=100.0)
        [await m.receive() for m in members]  # stop
        await members[0].send("stopped", generation=0, committed=[5], replicas={"1": [5]})
        await members[1].send("stopped", generation=0, committed=[5], replicas={"0": [5]})
        [await m.receive() for m in members]  # start of generation 1, from step 5
        await members[1].send("restored", step=5, tier="local", seconds=0.01, bytes=100)
        await members[1].send("loaded", generation=1, step=5)
        await members[0].send("checkpoint_invalid", step=5, tier="persistent", reason="upload failed")
        await eventually(lambda: len(leader.memory.restores) == 1 and leader.memory.failed_saves)
        memory = leader.memory
        assert (memory.generation, memory.restarts, len(memory.faults), len(memory.recoveries)) == (
            1,
            {"crash": 1},
            1,
            1,
        )
        # The restart state's own bookkeeping of this process (acks, holds, timers) is no memory of the job.
        carried = through_json(memory)
        assert carried.to_json() == memory.to_json()
        assert carried.restart == dataclasses.replace(
            RestartState(), **{f: getattr(memory.restart, f) for f in JOB_PART}
        )
        for member in members:
            member.close()
        await leader.close()

    run(scenario)
