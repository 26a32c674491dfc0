"""`slicekeeper run`: the job on one machine, one supervisor process per TPU host.

The local runtime plays the operator's part with processes: it lays the job out (api.local_layout),
starts one supervisor per host (each runs one workload process), watches the leader's status to
show live progress (supervisor.live_view: redrawn in place on a terminal, plain lines in a log), and
at the end gathers every host's accounting into the report (JSON, and a page to look at next to it:
slicekeeper.report_page). A supervisor killed by a signal while the job runs is started again on its
machine, as a kubelet restarts a container. Ctrl-C stops every process it started: supervisors get
SIGTERM, then SIGKILL; workloads die with them.

Each supervisor is held through a pidfd (SupervisorProcess), its exit status read once, there: a pid
is a number the kernel hands out again once its process is reaped, so nothing here waits for, or
signals, a supervisor or its process group by number after that.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Final, TextIO

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTier, PersistentTierError
from slicekeeper.supervisor.host import partition
from slicekeeper.supervisor.leader.election import LEASE_FILE, read_lease_file
from slicekeeper.supervisor.live_view import ProgressMode, run_view
from slicekeeper.supervisor.plan import JobPlan
from slicekeeper.supervisor.ports import free_port
from slicekeeper.supervisor.tls import JobTls
from slicekeeper.supervisor.workload_process import die_with_parent

from slicekeeper import credentials, protocol
from slicekeeper.api import TrainingJob
from slicekeeper.chaos import ChaosKind, check_hosts, parse_chaos
from slicekeeper.errors import UserError
from slicekeeper.recovery_breakdown import add_breakdowns
from slicekeeper.report import build_report, format_report
from slicekeeper.report_page import write_page
from slicekeeper.shape import JobLayout

DEFAULT_CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "slicekeeper" / "jax-compilation-cache"
)
CREDENTIALS_DIR = "credentials"
"""In the run directory: this run's own CA and certificate (slicekeeper.credentials), its user's only."""
STOP_GRACE_SECONDS = 5.0
UNHEARD_END_SECONDS = 15.0
"""A host's supervisor still running this long after the job ended did not hear the end (its machine
is cut off by a partition): it is stopped rather than waited for until it gives up on the leader."""
MACHINE_RESTARTS = 3
"""How often one machine's supervisor is started again after dying of a signal, at most."""
LONE_FAILURE_SECONDS = 60.0
"""How long the other hosts' supervisors may go on after one failed on its own (see _hosts_ended)."""
STATUS_LOST: Final = 256
"""A supervisor's code when another waiter in this process reaped it first (not an exit code: those
are 0-255, or minus a signal): a stale `subprocess.Popen` whose own child was reaped behind its back
polls its pid whenever a Popen is made, and the kernel may have given that pid to a supervisor."""


class SupervisorProcess:
    """One supervisor process, owned through a pidfd: the one place that reaps it and reads its exit
    status, and that signals it or its process group, which only while it is not reaped (its pid, the
    group's id, is still its own then). What a supervisor left in its process group is killed as it
    ends, before it is reaped, as a container's processes end with it.

    The Popen that starts it is never asked about it (poll, wait and send_signal reap by pid) and is
    told its code once it is read, so that nothing in subprocess polls that pid later either.
    """

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.returncode: int | None = None
        """Its exit code (minus the signal that killed it), or STATUS_LOST; None while not reaped."""
        self._loop = asyncio.get_running_loop()
        self._ended: asyncio.Future[int] = self._loop.create_future()
        self._pidfd = os.pidfd_open(self.pid)
        self._loop.add_reader(self._pidfd, self._exited)

    @classmethod
    def start(
        cls, argv: list[str], log: IO[bytes] | None = None, group: int | None = None
    ) -> SupervisorProcess:
        """Start `argv` in its own session (its process group is its pid), dying with this process;
        under group id `group` (None: this process's)."""
        return cls(
            subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT if log is not None else None,
                start_new_session=True,
                preexec_fn=die_with_parent,
                group=group,
            )
        )

    async def wait(self) -> int:
        # Shielded: a waiter given up on (a timeout) must not cancel the end other waiters await.
        return await asyncio.shield(self._ended)

    def send_signal(self, signum: signal.Signals) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signum)

    def kill_group(self) -> None:
        """SIGKILL its process group, while that is still its own."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)

    def _exited(self) -> None:
        """Its pidfd is readable: it exited. It is seen a zombie first (WNOWAIT), so that its pid
        still names its process group while what is left there is killed, and only then reaped."""
        try:
            if os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                return
            self.kill_group()
            status = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            status = None
        code = STATUS_LOST if status is None else _exit_code(status)
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self.returncode = self._popen.returncode = code
        self._ended.set_result(code)


def _exit_code(status: os.waitid_result) -> int:
    """subprocess's form of a wait status: the exit code, or minus the signal that killed it."""
    return status.si_status if status.si_code == os.CLD_EXITED else -status.si_status


def _check_writable(path: Path, what: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".slicekeeper-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise UserError(f"{what}: '{path}' is not writable: {error.strerror or error}") from None


class LocalRuntime:
    def __init__(
        self,
        job: TrainingJob,
        layout: JobLayout,
        *,
        steps: int | None = None,
        chaos: str | None = None,
        report_path: Path | None = None,
        out: TextIO = sys.stdout,
        progress: ProgressMode = "auto",
    ) -> None:
        self.job = job
        self.faults = parse_chaos(chaos)
        check_hosts(self.faults, layout.shape.host_count)
        self._partitions = any(f.kind is ChaosKind.PARTITION for f in self.faults)
        """Chaos `partition` among the faults: each machine runs under a group id of its own
        (supervisor.host.partition)."""
        if self._partitions:
            partition.check_available()
        self.layout = layout
        """The job scaled down to this machine (slicekeeper.api.local_layout)."""
        self.total_steps = steps if steps is not None else job.spec.workload.steps
        if self.total_steps < 1:
            raise UserError("--steps: must be at least 1")
        work_dir = job.spec.local.work_dir
        if work_dir:
            self.run_dir = (
                Path(work_dir) / f"{job.metadata.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            )
            _check_writable(self.run_dir, "spec.local.workDir")
        else:
            self.run_dir = Path(tempfile.mkdtemp(prefix=f"slicekeeper-{job.metadata.name}-"))
        self.checkpoint_root = Path(job.spec.checkpoint.local_dir) / self.run_dir.name
        _check_writable(self.checkpoint_root, "spec.checkpoint.localDir")
        self.report_path = report_path or self.run_dir / "report.json"
        _check_writable(self.report_path.parent, "--report")
        self.spares = job.spec.local.spares
        self.run_key = f"{job.metadata.name}/{self.run_dir.name}"
        persistent = job.spec.checkpoint.persistent
        if persistent is not None:
            # Reported now, not at the first save minutes into the run.
            try:
                PersistentTier(persistent.uri, self.run_key).probe()
            except PersistentTierError as error:
                raise UserError(f"spec.checkpoint.persistent.uri: {error}") from None
        self.out = out
        self.view = run_view(out, progress, job_name=job.metadata.name, total_steps=self.total_steps)
        """Where everything the run prints goes (`progress`: live, plain, or auto by `out`)."""
        self._supervisors: list[SupervisorProcess] = []
        self._machines: list[str] = []
        self._capacity = [f for f in self.faults if f.kind is ChaosKind.SPARE]
        """Chaos `spare:+N@step=S`: spare machines that join when the job reaches step S."""
        self._spares: list[asyncio.Task[int]] = []
        """The spare machines' supervisors (kept running like the hosts')."""
        self._interrupted = False
        self._stopping = False
        """The run is over: supervisors ending now are not started again."""
        self._printed_ports = False

    def _say(self, text: str) -> None:
        self.view.say(text)

    def _plan(self) -> JobPlan:
        return JobPlan(
            training_job=self.job,
            layout=self.layout,
            run_dir=str(self.run_dir),
            leader=f"127.0.0.1:{free_port()}",
            total_steps=self.total_steps,
            checkpoint_root=str(self.checkpoint_root),
            compilation_cache=os.environ.get("SLICEKEEPER_COMPILATION_CACHE", str(DEFAULT_CACHE)),
            local=True,
            chaos=[str(f) for f in self.faults],
            metrics_port=self.job.spec.local.metrics_port,
            spares=self.spares,
            run_key=self.run_key,
            credentials=str(self.run_dir / CREDENTIALS_DIR),
        )

    async def run(self) -> dict[str, Any]:
        plan = self._plan()
        credentials.generate(self.job.metadata.name).write(Path(plan.credentials))
        plan_path = self.run_dir / "plan.json"
        plan.write(plan_path)
        shape = self.layout.shape
        self._say(
            f"slicekeeper: running {self.job.metadata.name} locally: {shape.slices} slice(s) x "
            f"{shape.hosts_per_slice} host(s) x {shape.devices_per_host} CPU device(s), "
            f"{self.total_steps} steps" + (f", {self.spares} spare(s)" if self.spares else "")
        )
        if self.faults:
            self._say("  chaos: " + ", ".join(str(f) for f in self.faults))
        self._say(f"  run directory: {self.run_dir}  (plan, logs, reports)")
        started = time.time()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._interrupt)
        try:
            self.view.start()
            hosts = [
                self._keep(plan, plan_path, machine) for machine in plan.machines[: plan.shape.host_count]
            ]
            for machine in plan.machines[plan.shape.host_count :]:
                self._spares.append(self._keep(plan, plan_path, machine))
            watcher = asyncio.create_task(self._watch(plan, plan_path))
            codes = await self._hosts_ended(hosts)
            # The job is over once every host's supervisor ended. Spares end when the leader says so;
            # one that joined too late to hear it is stopped below (_stop_all), after a short grace.
            spares = [keeper for keeper in self._spares if not keeper.done()]
            if spares:
                await asyncio.wait(spares, timeout=STOP_GRACE_SECONDS)
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        finally:
            self.view.stop()
            self._stopping = True
            await self._stop_all()
            for keeper in self._spares:
                keeper.cancel()
            if self._partitions:
                for table in await asyncio.to_thread(partition.remove_all, self.run_key):
                    self._say(f"  chaos: removed the partition left in place ({table})")
            shutil.rmtree(self.checkpoint_root, ignore_errors=True)
        wall = time.time() - started
        report = self._gather(plan, started, wall)
        events = self.run_dir / "policy-events.jsonl"
        if events.exists():
            # The decisions' event log, next to the report: `slicekeeper policy replay` reads it.
            events_copy = self.report_path.with_name(self.report_path.stem + ".events.jsonl")
            shutil.copyfile(events, events_copy)
            report["events_log"] = str(events_copy)
        if self._interrupted:
            report["state"], report["failure_reason"] = "interrupted", "stopped by the user (Ctrl-C)"
        elif report["state"] != "succeeded" and not report.get("failure_reason"):
            report["failure_reason"] = (
                f"supervisors exited with {codes}; see {self.run_dir}/host-*/supervisor.log"
            )
        self.report_path.write_text(json.dumps(report, indent=1))
        self._say("")
        self._say(format_report(report))
        self._say(f"  report: {self.report_path}")
        write_page_beside(report, self.report_path, self._say)
        return report

    def _gather(self, plan: JobPlan, started: float, wall: float) -> dict[str, Any]:
        summary_path = self.run_dir / "job-summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {"state": "failed"}
        hosts = []
        for machine in self._machines:
            # report.json, and the reports of supervisors that ran on the machine before it
            for path in sorted(plan.machine_dir(machine).glob("report*.json")):
                hosts.append(json.loads(path.read_text()))
        report = build_report(
            job_name=self.job.metadata.name,
            started_at=started,
            wall_seconds=wall,
            summary=summary,
            hosts=hosts,
        )
        report["run_dir"] = str(self.run_dir)
        add_breakdowns(report, self.run_dir)
        return report

    async def _hosts_ended(self, hosts: list[asyncio.Task[int]]) -> list[int]:
        """Every host's supervisor's exit code, once all ended. One that failed on its own (exit 1,
        or an end whose status another waiter took: STATUS_LOST) while the others still run after
        the time a leader is waited for means the run is broken (e.g. it died before it registered,
        and the job waits for it): every other is stopped."""
        summary = self.run_dir / "job-summary.json"
        while pending := [host for host in hosts if not host.done()]:
            # Looked at before waiting: a host's task may have ended before this one first ran.
            failed = [h for h in hosts if h.done() and h.result() in (protocol.EXIT_JOB_FAILED, STATUS_LOST)]
            if not failed:
                await asyncio.wait(pending, timeout=STOP_GRACE_SECONDS, return_when=asyncio.FIRST_COMPLETED)
                if summary.exists() and time.time() - summary.stat().st_mtime > UNHEARD_END_SECONDS:
                    # The job ended a while ago: who still runs cannot hear it (a machine cut off).
                    self._say("slicekeeper: the job ended; stopping the supervisors that did not hear it")
                    self._stopping = True
                    await self._stop_all()
                    await asyncio.gather(*hosts)
                continue
            # asyncio.wait, not wait_for: a timeout must not cancel the hosts' tasks.
            await asyncio.wait(pending, timeout=LONE_FAILURE_SECONDS)
            if not all(host.done() for host in hosts):
                machine = self._machines[hosts.index(failed[0])]
                self._say(f"slicekeeper: {machine}'s supervisor failed and the others went on; stopping")
                self._stopping = True
                await self._stop_all()
                await asyncio.gather(*hosts)
        return [host.result() for host in hosts]

    def _keep(
        self, plan: JobPlan, plan_path: Path, machine: str, joined_by: str | None = None
    ) -> asyncio.Task[int]:
        """Run one machine's supervisor until it ends; its exit code."""
        self._machines.append(machine)
        return asyncio.create_task(self._keep_running(plan, plan_path, machine, joined_by))

    async def _keep_running(self, plan: JobPlan, plan_path: Path, machine: str, joined_by: str | None) -> int:
        """A supervisor killed by a signal is started again on its machine, as a kubelet restarts a
        container (its disk intact), at most MACHINE_RESTARTS times; one that exited (done, failed,
        its machine lost) is not."""
        restart = 0
        while True:
            process = self._launch(plan, plan_path, machine, joined_by, restart)
            code = await process.wait()
            if self._stopping or self._interrupted or code >= 0 or -code in (signal.SIGTERM, signal.SIGINT):
                return code
            if restart >= MACHINE_RESTARTS:
                died = signal.Signals(-code).name
                self._say(f"  {machine}: its supervisor died again ({died}); not started again")
                return code
            restart += 1
            self.view.event(
                f"{machine}: its supervisor died ({signal.Signals(-code).name}); "
                "starting it again on the same machine"
            )

    def _launch(
        self, plan: JobPlan, plan_path: Path, machine: str, joined_by: str | None, restart: int
    ) -> SupervisorProcess:
        """Start one machine's supervisor, in its own process group, logging to its machine folder."""
        machine_dir = plan.machine_dir(machine)
        machine_dir.mkdir(parents=True, exist_ok=True)
        role, index = machine.rsplit("-", 1)
        extra = ["--joined-by", joined_by] if joined_by else []
        extra += ["--restart", str(restart)] if restart else []
        argv = [sys.executable, "-m", "slicekeeper.supervisor", "--plan", str(plan_path), f"--{role}", index]
        # With a partition among the faults, a group id of its own: how its packets are told apart.
        ordinal = int(index) + (plan.shape.host_count if role == "spare" else 0)
        group = partition.GROUP_ID_BASE + ordinal if self._partitions else None
        with (machine_dir / "supervisor.log").open("ab") as log:
            self._supervisors.append(SupervisorProcess.start(argv + extra, log, group=group))
        return self._supervisors[-1]

    async def _capacity_returns(self, plan: JobPlan, plan_path: Path, step: int) -> None:
        """Chaos `spare:+N@step=S`: the job reached step S, N new spare machines join it."""
        for fault in [f for f in self._capacity if f.step <= step]:
            self._capacity.remove(fault)
            for _ in range(fault.count):
                spare = f"spare-{sum(1 for m in self._machines if m.startswith('spare-'))}"
                self.view.event(f"chaos: {fault}: {spare} joins")
                self._spares.append(self._keep(plan, plan_path, spare, joined_by=str(fault)))

    def _interrupt(self) -> None:
        if not self._interrupted:
            self._interrupted = True
            self._say("\nslicekeeper: interrupted; stopping every host")
            asyncio.get_running_loop().call_later(STOP_GRACE_SECONDS, self._kill_all)
        for process in self._supervisors:
            process.send_signal(signal.SIGTERM)

    def _kill_all(self) -> None:
        """The grace period is over: SIGKILL every running supervisor's process group (workloads
        follow)."""
        for process in self._supervisors:
            process.kill_group()

    async def _stop_all(self) -> None:
        """Nothing left running: SIGTERM, a grace period, then SIGKILL of each process group. Only
        supervisors not reaped yet are signalled: one that ended had its group killed then."""
        alive = [p for p in self._supervisors if p.returncode is None]
        for process in alive:
            process.send_signal(signal.SIGTERM)
        ends = [asyncio.create_task(process.wait()) for process in alive]
        if ends:
            await asyncio.wait(ends, timeout=STOP_GRACE_SECONDS)
        for process in alive:
            process.kill_group()
        await asyncio.gather(*ends)

    async def _watch(self, plan: JobPlan, plan_path: Path) -> None:
        """Show live progress from the leader's status lines (and bring in spares due at a step),
        following the leader the job's lease names when it changes."""
        lease_file = Path(plan.run_dir) / LEASE_FILE
        tls = JobTls(Path(plan.credentials))
        address, deadline = plan.leader, time.time() + 60
        while True:
            host, port = address.rsplit(":", 1)
            try:
                reader, writer = await tls.connect(host, int(port), limit=protocol.CONTROL_LINE_LIMIT)
            except OSError:
                if time.time() > deadline:
                    return
                await asyncio.sleep(0.2)
                lease = await asyncio.to_thread(read_lease_file, lease_file)
                if lease is not None and lease.leader is not None:
                    address = lease.leader.address
                continue
            writer.write(messages.Watch().encode())
            await self._show(plan, plan_path, reader)
            writer.close()
            deadline = time.time() + 60

    async def _show(self, plan: JobPlan, plan_path: Path, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(OSError):  # ConnectionError, or ssl.SSLError on a cut TLS stream
            while line := await reader.readline():
                message = messages.to_watcher(line)
                if isinstance(message, messages.EventNote):
                    self.view.event(message.text, message.t)
                    continue
                if self._capacity and message.state == "running":
                    await self._capacity_returns(plan, plan_path, max(h.step for h in message.hosts))
                ports = [h.metrics_port for h in message.hosts]
                if not self._printed_ports and all(ports):
                    self._printed_ports = True
                    self._say(
                        "  metrics: "
                        + ", ".join(f"host {i} http://127.0.0.1:{p}/metrics" for i, p in enumerate(ports))
                    )
                self.view.status(message)


def write_page_beside(report: dict[str, Any], report_path: Path, say: Callable[[str], None]) -> None:
    """The run's page next to its report (slicekeeper.report_page), its path said. The report is
    written already and the run's outcome is decided: a page that cannot be written is only said."""
    try:
        page = write_page(report, report_path)
    except Exception as error:
        say(f"  page: not written ({type(error).__name__}: {error})")
    else:
        say(f"  page: {page}")
