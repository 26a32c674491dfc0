"""`slicekeeper run`: the job on one machine, one supervisor process per TPU host.

The local runtime plays the operator's part with processes: what the run is, checked once, is a
frozen RunSetup (supervisor.local.local_setup: the job laid out (api.local_layout), its chaos, its folders);
its machines (`Machines`) start one supervisor per host (each runs one workload process) and per
spare; a watcher of the leader's status shows live progress (supervisor.local.local_watch, drawn by
supervisor.local.live_view: redrawn in place on a terminal, plain lines in a log); at the end every host's
accounting is gathered into the report (JSON, and a page to look at next to it:
slicekeeper.report_page). A supervisor killed by a signal while the job runs is started again on its
machine, as a kubelet restarts a container. Ctrl-C stops every process it started: supervisors get
SIGTERM, then SIGKILL; workloads die with them.

Supervisors are forked from one process that imported them once (supervisor.local.fork_server),
which reaps them and says how each ended; each is held here through a pidfd: a pid is a number the
kernel hands out again once its process is reaped, so nothing here signals a supervisor by number.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from slicekeeper.supervisor.host import partition
from slicekeeper.supervisor.leader.settings import POLICY_EVENTS_FILE, SUMMARY_FILE
from slicekeeper.supervisor.local.fork_server import SERVER_GONE, ForkedSupervisor, SupervisorForks
from slicekeeper.supervisor.local.live_view import ProgressMode, RunView, run_view
from slicekeeper.supervisor.local.local_setup import RunSetup
from slicekeeper.supervisor.local.local_watch import StatusWatch
from slicekeeper.supervisor.plan import JobPlan

from slicekeeper import credentials, protocol
from slicekeeper.api import TrainingJob
from slicekeeper.recovery_breakdown import add_breakdowns
from slicekeeper.report import build_report, format_report
from slicekeeper.report_page import write_page
from slicekeeper.shape import JobLayout

STOP_GRACE_SECONDS = 5.0
UNHEARD_END_SECONDS = 5.0
"""A host's supervisor still running this long after the job ended did not hear the end (its machine
is cut off by a partition): it is stopped rather than waited for until it gives up on the leader. One
that hears the end exits within a second of it; SIGTERM still lets a slow one write its report."""
END_POLL_SECONDS = 1.0
"""How often the job's end is looked for while some host's supervisor still runs."""
MACHINE_RESTARTS = 3
"""How often one machine's supervisor is started again after dying of a signal, at most."""
LONE_FAILURE_SECONDS = 60.0
"""How long the other hosts' supervisors may go on after one failed on its own (see Machines.hosts_ended)."""


class Machines:
    """The run's machines and the supervisor of each, kept running as a kubelet keeps a container (one
    killed by a signal is started again on its machine), and stopped together at the end."""

    def __init__(self, setup: RunSetup, view: RunView) -> None:
        self._setup = setup
        self._view = view
        self.names: list[str] = []
        """Every machine the run started, in order: `host-i`, then `spare-j`."""
        self.forks: SupervisorForks | None = None
        """Where supervisors are forked from (supervisor.local.fork_server); set for the run."""
        self.processes: list[ForkedSupervisor] = []
        """Every supervisor process started, the ones started again included."""
        self.spares: list[asyncio.Task[int]] = []
        """The spare machines' keepers (kept running like the hosts')."""
        self.stopping = False
        """The run is over, or interrupted: supervisors ending now are not started again."""

    def keep(
        self, plan: JobPlan, plan_path: Path, machine: str, joined_by: str | None = None
    ) -> asyncio.Task[int]:
        """Run one machine's supervisor until it ends; its exit code."""
        self.names.append(machine)
        return asyncio.create_task(self._keep_running(plan, plan_path, machine, joined_by))

    def keep_spare(self, plan: JobPlan, plan_path: Path, machine: str, joined_by: str | None = None) -> None:
        """Run spare machine `machine`'s supervisor until it ends (`joined_by`: the chaos fault it
        joined the job by, None: one of the job's spares)."""
        self.spares.append(self.keep(plan, plan_path, machine, joined_by))

    def next_spare(self) -> str:
        """The name of the next spare machine to join."""
        return f"spare-{sum(1 for m in self.names if m.startswith('spare-'))}"

    async def _keep_running(self, plan: JobPlan, plan_path: Path, machine: str, joined_by: str | None) -> int:
        """A supervisor killed by a signal is started again on its machine, as a kubelet restarts a
        container (its disk intact), at most MACHINE_RESTARTS times; one that exited (done, failed,
        its machine lost) is not."""
        restart = 0
        while True:
            process = await self._launch(plan, plan_path, machine, joined_by, restart)
            code = await process.wait()
            if self.stopping or code >= 0 or -code in (signal.SIGTERM, signal.SIGINT):
                return code
            if restart >= MACHINE_RESTARTS:
                died = signal.Signals(-code).name
                self._view.say(f"  {machine}: its supervisor died again ({died}); not started again")
                return code
            restart += 1
            self._view.event(
                f"{machine}: its supervisor died ({signal.Signals(-code).name}); "
                "starting it again on the same machine"
            )

    async def _launch(
        self, plan: JobPlan, plan_path: Path, machine: str, joined_by: str | None, restart: int
    ) -> ForkedSupervisor:
        """Start one machine's supervisor, in its own process group, logging to its machine folder."""
        assert self.forks is not None, "the run's fork server is started before its machines"
        machine_dir = plan.machine_dir(machine)
        machine_dir.mkdir(parents=True, exist_ok=True)
        role, index = machine.rsplit("-", 1)
        extra = ["--joined-by", joined_by] if joined_by else []
        extra += ["--restart", str(restart)] if restart else []
        args = ["--plan", str(plan_path), f"--{role}", index]
        # With a partition among the faults, a group id of its own: how its packets are told apart.
        ordinal = int(index) + (plan.shape.host_count if role == "spare" else 0)
        group = partition.GROUP_ID_BASE + ordinal if self._setup.partitions else None
        with (machine_dir / "supervisor.log").open("ab") as log:
            self.processes.append(await self.forks.start(args + extra, log.fileno(), group))
        return self.processes[-1]

    async def hosts_ended(self, hosts: list[asyncio.Task[int]]) -> list[int]:
        """Every host's supervisor's exit code, once all ended. One that failed on its own (exit 1,
        or an end the fork server could not see: SERVER_GONE) while the others still run after
        the time a leader is waited for means the run is broken (e.g. it died before it registered,
        and the job waits for it): every other is stopped."""
        summary = self._setup.run_dir / SUMMARY_FILE
        while pending := [host for host in hosts if not host.done()]:
            # Looked at before waiting: a host's task may have ended before this one first ran.
            failed = [h for h in hosts if h.done() and h.result() in (protocol.EXIT_JOB_FAILED, SERVER_GONE)]
            if not failed:
                await asyncio.wait(pending, timeout=END_POLL_SECONDS, return_when=asyncio.FIRST_COMPLETED)
                if summary.exists() and time.time() - summary.stat().st_mtime > UNHEARD_END_SECONDS:
                    # The job ended a while ago: who still runs cannot hear it (a machine cut off).
                    self._view.say(
                        "slicekeeper: the job ended; stopping the supervisors that did not hear it"
                    )
                    await self.stop_all()
                    await asyncio.gather(*hosts)
                continue
            # asyncio.wait, not wait_for: a timeout must not cancel the hosts' tasks.
            await asyncio.wait(pending, timeout=LONE_FAILURE_SECONDS)
            if not all(host.done() for host in hosts):
                machine = self.names[hosts.index(failed[0])]
                self._view.say(f"slicekeeper: {machine}'s supervisor failed and the others went on; stopping")
                await self.stop_all()
                await asyncio.gather(*hosts)
        return [host.result() for host in hosts]

    async def spares_end(self) -> None:
        """The job is over: spares end when the leader says so; one that joined too late to hear it
        is given a short grace (then stopped with the rest)."""
        spares = [keeper for keeper in self.spares if not keeper.done()]
        if spares:
            await asyncio.wait(spares, timeout=STOP_GRACE_SECONDS)

    def interrupt(self) -> None:
        """The user stops the run: no supervisor is started again, each is sent SIGTERM."""
        self.stopping = True
        for process in self.processes:
            process.send_signal(signal.SIGTERM)

    def kill_all(self) -> None:
        """The grace period is over: SIGKILL every running supervisor's process group (workloads
        follow)."""
        for process in self.processes:
            process.kill_group()

    async def stop_all(self) -> None:
        """Nothing left running, nothing started again: SIGTERM, a grace period, then SIGKILL of each
        process group. Only supervisors not reaped yet are signalled: one that ended had its group
        killed then."""
        self.stopping = True
        alive = [p for p in self.processes if p.returncode is None]
        for process in alive:
            process.send_signal(signal.SIGTERM)
        ends = [asyncio.create_task(process.wait()) for process in alive]
        if ends:
            await asyncio.wait(ends, timeout=STOP_GRACE_SECONDS)
        for process in alive:
            process.kill_group()
        await asyncio.gather(*ends)


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
        self.setup = RunSetup.prepare(job, layout, steps=steps, chaos=chaos, report_path=report_path)
        """What the run is, checked (supervisor.local.local_setup)."""
        self.view = run_view(out, progress, job_name=job.metadata.name, total_steps=self.setup.total_steps)
        """Where everything the run prints goes (`progress`: live, plain, or auto by `out`)."""
        self.machines = Machines(self.setup, self.view)
        self._interrupted = False

    def _say(self, text: str) -> None:
        self.view.say(text)

    async def run(self) -> dict[str, Any]:
        setup = self.setup
        plan = setup.plan()
        credentials.generate(setup.job.metadata.name).write(Path(plan.credentials))
        plan_path = setup.run_dir / "plan.json"
        plan.write(plan_path)
        shape = setup.layout.shape
        self._say(
            f"slicekeeper: running {setup.job.metadata.name} locally: {shape.slices} slice(s) x "
            f"{shape.hosts_per_slice} host(s) x {shape.devices_per_host} CPU device(s), "
            f"{setup.total_steps} steps" + (f", {setup.spares} spare(s)" if setup.spares else "")
        )
        if setup.faults:
            self._say("  chaos: " + ", ".join(str(f) for f in setup.faults))
        self._say(f"  run directory: {setup.run_dir}  (plan, logs, reports)")
        started = time.time()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._interrupt)
        self.machines.forks = await SupervisorForks.launch(f"slicekeeper supervisors of {setup.run_dir}")
        try:
            self.view.start()
            hosts = [
                self.machines.keep(plan, plan_path, machine)
                for machine in plan.machines[: plan.shape.host_count]
            ]
            for machine in plan.machines[plan.shape.host_count :]:
                self.machines.keep_spare(plan, plan_path, machine)
            watch = StatusWatch(plan, plan_path, view=self.view, machines=self.machines, faults=setup.faults)
            watcher = asyncio.create_task(watch.run())
            codes = await self.machines.hosts_ended(hosts)
            # The job is over once every host's supervisor ended. Spares end when the leader says so;
            # one that joined too late to hear it is stopped below (stop_all), after a short grace.
            await self.machines.spares_end()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        finally:
            self.view.stop()
            await self.machines.stop_all()
            for keeper in self.machines.spares:
                keeper.cancel()
            await self.machines.forks.close()
            if setup.partitions:
                for table in await asyncio.to_thread(partition.remove_all, setup.run_key):
                    self._say(f"  chaos: removed the partition left in place ({table})")
            shutil.rmtree(setup.checkpoint_root, ignore_errors=True)
        wall = time.time() - started
        report = self._gather(plan, started, wall)
        report_path = setup.report_path
        events = setup.run_dir / POLICY_EVENTS_FILE
        if events.exists():
            # The decisions' event log, next to the report: `slicekeeper policy replay` reads it.
            events_copy = report_path.with_name(report_path.stem + ".events.jsonl")
            shutil.copyfile(events, events_copy)
            report["events_log"] = str(events_copy)
        if self._interrupted:
            report["state"], report["failure_reason"] = "interrupted", "stopped by the user (Ctrl-C)"
        elif report["state"] != "succeeded" and not report.get("failure_reason"):
            report["failure_reason"] = (
                f"supervisors exited with {codes}; see {setup.run_dir}/host-*/supervisor.log"
            )
        report_path.write_text(json.dumps(report, indent=1))
        self._say("")
        self._say(format_report(report))
        self._say(f"  report: {report_path}")
        write_page_beside(report, report_path, self._say)
        return report

    def _gather(self, plan: JobPlan, started: float, wall: float) -> dict[str, Any]:
        run_dir = self.setup.run_dir
        summary_path = run_dir / SUMMARY_FILE
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {"state": "failed"}
        hosts = []
        for machine in self.machines.names:
            # report.json, and the reports of supervisors that ran on the machine before it
            for path in sorted(plan.machine_dir(machine).glob("report*.json")):
                hosts.append(json.loads(path.read_text()))
        report = build_report(
            job_name=self.setup.job.metadata.name,
            started_at=started,
            wall_seconds=wall,
            summary=summary,
            hosts=hosts,
        )
        report["run_dir"] = str(run_dir)
        add_breakdowns(report, run_dir)
        return report

    def _interrupt(self) -> None:
        if not self._interrupted:
            self._interrupted = True
            self._say("\nslicekeeper: interrupted; stopping every host")
            asyncio.get_running_loop().call_later(STOP_GRACE_SECONDS, self.machines.kill_all)
        self.machines.interrupt()


def write_page_beside(report: dict[str, Any], report_path: Path, say: Callable[[str], None]) -> None:
    """The run's page next to its report (slicekeeper.report_page), its path said. The report is
    written already and the run's outcome is decided: a page that cannot be written is only said."""
    try:
        page = write_page(report, report_path)
    except Exception as error:
        say(f"  page: not written ({type(error).__name__}: {error})")
    else:
        say(f"  page: {page}")
