"""A local run ends when its hosts' supervisors do, and a supervisor that failed alone ends it too.

`slicekeeper run` waits for every host's supervisor (supervisor/local/local_runtime.py). One that exits 1
on its own while the others run on (it died before it registered, say, and the job waits for it
forever) would leave the run hanging: after LONE_FAILURE_SECONDS the others are stopped, and nothing
is left running. A failure the others share (the leader failed the job, so every supervisor exits)
stops nobody early. The supervisors here are real processes standing in for them, forked and reaped
by the run's own fork server, as in a run.
"""

from __future__ import annotations

import asyncio
import io
import os
import sys

import pytest
from slicekeeper.supervisor.local import local_runtime
from slicekeeper.supervisor.local.fork_server import SupervisorForks
from slicekeeper.supervisor.local.local_runtime import LocalRuntime

from slicekeeper.api import TrainingJob, dump_training_job, load_training_job
from slicekeeper.shape import JobLayout, JobShape
from tests.support.plans import EXAMPLE
from tests.support.stand_ins import STAND_IN

RUNNING = "import time; time.sleep(600)"
# The failing supervisor exits only once every host has been started, as in a run.
FAILED = "import time; time.sleep(0.3); raise SystemExit(1)"
ENDS_WELL_SOON = "import time; time.sleep(0.8)"


def runtime(tmp_path, out: io.StringIO) -> LocalRuntime:
    spec = dump_training_job(load_training_job(EXAMPLE))
    spec["spec"]["local"] = {"workDir": str(tmp_path / "runs")}
    spec["spec"]["checkpoint"]["localDir"] = str(tmp_path / "disk")
    job = TrainingJob.model_validate(spec)
    shape = JobShape(slices=2, hosts_per_slice=2, devices_per_host=2)
    return LocalRuntime(job, JobLayout(job.metadata.name, shape), out=out)


async def hosts_ending(run: LocalRuntime, programs: list[str]) -> tuple[list[int], list[int]]:
    """Each program as a host's supervisor; their exit codes as the runtime saw them, and the pids."""
    processes = []
    forks = await SupervisorForks.launch("test stand-ins")
    for program in programs:
        process = await forks.start([program], sys.stdout.fileno(), entry=STAND_IN)
        run.machines.processes.append(process)
        run.machines.names.append(f"host-{len(processes)}")
        processes.append(process)
    hosts = [asyncio.create_task(process.wait()) for process in processes]
    try:
        codes = await asyncio.wait_for(run.machines.hosts_ended(hosts), timeout=60)
    except TimeoutError:
        ended = {i: p.returncode for i, p in enumerate(processes) if p.returncode is not None}
        for process in processes:
            process.kill_group()
            await process.wait()
        pytest.fail(f"the run did not end within 60 s; hosts that ended, with their codes: {ended}")
    finally:
        await forks.close()
    return codes, [process.pid for process in processes]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(autouse=True)
def short_patience(monkeypatch):
    monkeypatch.setattr(local_runtime, "LONE_FAILURE_SECONDS", 2.0)


def test_a_supervisor_that_failed_alone_stops_the_others_and_leaves_nothing_running(tmp_path):
    out = io.StringIO()
    codes, pids = asyncio.run(hosts_ending(runtime(tmp_path, out), [RUNNING, FAILED, RUNNING]))
    assert codes[1] == 1 and codes[0] < 0 and codes[2] < 0, codes  # the two still running were stopped
    assert "host-1's supervisor failed and the others went on; stopping" in out.getvalue()
    assert not any(alive(pid) for pid in pids)


def test_a_failure_the_others_share_stops_nobody_early(tmp_path):
    out = io.StringIO()
    codes, _ = asyncio.run(hosts_ending(runtime(tmp_path, out), [ENDS_WELL_SOON, FAILED, ENDS_WELL_SOON]))
    assert codes == [0, 1, 0]  # they ended by themselves within the patience given
    assert "stopping" not in out.getvalue()


def test_supervisors_that_all_end_well_end_the_run(tmp_path):
    out = io.StringIO()
    codes, _ = asyncio.run(hosts_ending(runtime(tmp_path, out), ["pass", ENDS_WELL_SOON, "pass"]))
    assert codes == [0, 0, 0] and out.getvalue() == ""
