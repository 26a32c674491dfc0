"""A local run signals and reaps only the supervisor processes it still owns.

`slicekeeper run` forks each supervisor from its fork server (supervisor/local/fork_server.py), which
reaps it, and holds it through a pidfd. A pid is only a number: once its process is reaped the kernel
gives it to the next process started, so a pid kept past that names another program, and its process
group another program's group. And the fork server is a process too: if it dies, its supervisors die
with it, and the run must still end.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slicekeeper.supervisor.local import local_runtime
from slicekeeper.supervisor.local.fork_server import SERVER_GONE, SupervisorForks
from slicekeeper.supervisor.local.local_runtime import LocalRuntime

from slicekeeper.api import TrainingJob, dump_training_job, load_training_job
from slicekeeper.shape import JobLayout, JobShape
from tests.support.cli_runs import ROOT
from tests.support.plans import EXAMPLE
from tests.support.stand_ins import STAND_IN

RUNNING = "import time; time.sleep(600)"

# Run in a PID namespace of its own, where /proc/sys/kernel/ns_last_pid chooses the next pid: a
# supervisor ends and is reaped, its pid goes to another program leading its own process group, and
# the runtime stops what it has left; then the pid goes to the fork server's next supervisor.
PID_REUSED = f"""
import asyncio, json, signal, subprocess, sys
from pathlib import Path
from slicekeeper.api import TrainingJob, dump_training_job, load_training_job
from slicekeeper.shape import JobLayout, JobShape
from slicekeeper.supervisor.local.fork_server import SupervisorForks
from slicekeeper.supervisor.local.local_runtime import LocalRuntime
from tests.support.plans import EXAMPLE
from tests.support.stand_ins import STAND_IN

async def main(tmp: Path) -> None:
    spec = dump_training_job(load_training_job(EXAMPLE))
    spec["spec"]["local"] = {{"workDir": str(tmp / "runs")}}
    spec["spec"]["checkpoint"]["localDir"] = str(tmp / "disk")
    shape = JobShape(slices=2, hosts_per_slice=2, devices_per_host=2)
    job = TrainingJob.model_validate(spec)
    run = LocalRuntime(job, JobLayout(job.metadata.name, shape))
    forks = await SupervisorForks.launch("test stand-ins")
    ended = await forks.start(["pass"], sys.stdout.fileno(), entry=STAND_IN)
    running = await forks.start([{RUNNING!r}], sys.stdout.fileno(), entry=STAND_IN)
    run.machines.processes += [ended, running]
    await ended.wait()
    Path("/proc/sys/kernel/ns_last_pid").write_text(str(ended.pid - 1))
    other = subprocess.Popen([sys.executable, "-c", {RUNNING!r}], start_new_session=True)
    await run.machines.stop_all()
    try:  # a SIGKILL takes effect once its target is scheduled
        other.wait(timeout=1)
    except subprocess.TimeoutExpired:
        pass
    seen = {{"reused": other.pid == ended.pid, "other": other.poll(), "running": running.returncode}}
    other.kill()
    other.wait()
    # The fork server's next child gets that pid once more: its end is its own, not the first's.
    Path("/proc/sys/kernel/ns_last_pid").write_text(str(ended.pid - 1))
    again = await forks.start([{RUNNING!r}], sys.stdout.fileno(), entry=STAND_IN)
    await asyncio.sleep(0.5)
    seen.update(again_reused=again.pid == ended.pid, again=again.returncode)
    again.send_signal(signal.SIGTERM)
    await again.wait()
    print(json.dumps(seen))
    await forks.close()

asyncio.run(main(Path(sys.argv[1])))
"""
NAMESPACE = ["unshare", "--user", "--map-root-user", "--pid", "--fork"]


def runtime(tmp_path: Path, out: io.StringIO) -> LocalRuntime:
    spec = dump_training_job(load_training_job(EXAMPLE))
    spec["spec"]["local"] = {"workDir": str(tmp_path / "runs")}
    spec["spec"]["checkpoint"]["localDir"] = str(tmp_path / "disk")
    job = TrainingJob.model_validate(spec)
    shape = JobShape(slices=2, hosts_per_slice=2, devices_per_host=2)
    return LocalRuntime(job, JobLayout(job.metadata.name, shape), out=out)


def pid_namespaces() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run([*NAMESPACE, "true"], capture_output=True).returncode == 0


def dead(pid: int) -> bool:
    """No such process, or a zombie left for its new parent to reap."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def gone(pid: int, seconds: float = 5.0) -> bool:
    """Dead within `seconds` (a SIGKILL takes effect once the process is scheduled)."""
    deadline = time.monotonic() + seconds
    while not dead(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return dead(pid)


@pytest.mark.skipif(not pid_namespaces(), reason="needs `unshare` into a user and PID namespace")
def test_the_pid_of_a_reaped_supervisor_is_not_signalled_once_another_program_has_it(tmp_path):
    result = subprocess.run(
        [*NAMESPACE, sys.executable, "-c", PID_REUSED, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen["reused"], "the kernel did not give the reaped supervisor's pid to the other program"
    assert seen["other"] is None, seen  # the other program's process group was left alone
    assert seen["running"] == -15, seen  # the supervisor still running was stopped
    assert seen["again_reused"], "the fork server's next child did not get the reaped one's pid"
    assert seen["again"] is None, seen  # still running: not taken for the child that had its pid before


def test_a_fork_server_lost_ends_the_run_and_its_supervisors(tmp_path, monkeypatch):
    monkeypatch.setattr(local_runtime, "LONE_FAILURE_SECONDS", 2.0)
    out = io.StringIO()

    async def hosts_ending() -> tuple[list[int], list[int]]:
        run = runtime(tmp_path, out)
        forks = await SupervisorForks.launch("test stand-ins")
        for index in range(3):
            run.machines.processes.append(await forks.start([RUNNING], sys.stdout.fileno(), entry=STAND_IN))
            run.machines.names.append(f"host-{index}")
        # Held through pidfds of our own: a pid freed by a death may be another program's by the check.
        pidfds = [os.pidfd_open(process.pid) for process in run.machines.processes]
        hosts = [asyncio.create_task(process.wait()) for process in run.machines.processes]
        os.kill(forks.pid, signal.SIGKILL)
        try:
            return await asyncio.wait_for(run.machines.hosts_ended(hosts), timeout=30), pidfds
        finally:
            await forks.close()

    codes, pidfds = asyncio.run(hosts_ending())
    # They died with it (PDEATHSIG): a pidfd is readable once its process has exited.
    dead = [bool(select.select([pidfd], [], [], 5.0)[0]) for pidfd in pidfds]
    for pidfd, gone in zip(pidfds, dead, strict=True):
        if not gone:  # nothing left running after the test, whatever it found
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        os.close(pidfd)
    assert codes == [SERVER_GONE] * 3, codes
    assert all(dead), dead


_SERVER_GONE_FIRST = """
import os, sys, time
from slicekeeper.supervisor.local.fork_server import StartRequest, become_supervisor
from tests.support.stand_ins import STAND_IN

marker, told = sys.argv[1], sys.argv[2]
answer, answered = os.pipe()
if os.fork() == 0:  # the server
    server = os.getpid()
    if os.fork() == 0:  # its child, which runs its first line once the server is gone
        while os.getppid() == server:
            time.sleep(0.01)
        program = f"import os, time; open({marker!r}, 'w').write(str(os.getpid())); time.sleep(60)"
        request = StartRequest(STAND_IN, [program], "stand-in", dict(os.environ), os.getcwd(), None)
        log = os.open(os.devnull, os.O_WRONLY)
        code = become_supervisor(request, log, server if told == "server" else os.getppid())
        os.write(answered, str(code).encode())
        os._exit(0)
    os._exit(0)
os.wait()
os.close(answered)
print(os.read(answer, 16).decode() or "none")
"""


@pytest.mark.parametrize("told", ["server", "parent-read-late"])
def test_a_child_whose_fork_server_ended_before_it_ran_ends_at_once(tmp_path, told):
    """The run may kill its fork server right after a start, before the child has run a line (a
    loaded machine). Told the server's pid, the child sees it is gone and ends (exit code 1) without
    running its program. The negative control reads its parent once the server is gone, as the
    child did before: it takes the process it was handed to for its server, sets PDEATHSIG on that,
    and runs its program past the server's end."""
    marker = tmp_path / "ran"
    script = subprocess.Popen(
        [sys.executable, "-c", _SERVER_GONE_FIRST, str(marker), told],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        if told == "server":
            out, _ = script.communicate(timeout=60)
            assert out.strip() == "1" and not marker.exists(), out
            return
        deadline = time.monotonic() + 60
        while not (marker.exists() and marker.read_text()):
            assert time.monotonic() < deadline, "the child never ran its program"
            time.sleep(0.05)
        os.kill(int(marker.read_text()), signal.SIGKILL)  # it outlived its server: the defect
        script.communicate(timeout=60)
    finally:
        script.kill()
        script.wait()


def test_what_a_supervisor_left_in_its_process_group_ends_with_it(tmp_path):
    left = tmp_path / "left.pid"
    program = (
        f"import subprocess; open({str(left)!r}, 'w').write(str(subprocess.Popen(['sleep', '600']).pid))"
    )

    async def supervisor_ending() -> int:
        forks = await SupervisorForks.launch("test stand-ins")
        try:
            return await (await forks.start([program], sys.stdout.fileno(), entry=STAND_IN)).wait()
        finally:
            await forks.close()

    assert asyncio.run(supervisor_ending()) == 0
    assert gone(int(left.read_text()))
