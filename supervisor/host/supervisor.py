"""A host's life: join the leader, follow its commands, and write down what this host did.

`HostSupervisor` builds the parts of a host and owns what they share: the host's identity (a spare
takes one over), the world it trains in, the goodput accountant and the event log. Each part gets
only the objects and callables it needs: the workload process (host.workload), the SDK's events
(host.sdk_events), the restart generation with its exit and hang watches (host.generation,
host.detectors), the chaos faults (host.chaos), the local or pod specifics (host.site), its part
in the election (host.leadership) and what it does while it leads (host.leader_duties), its
connection to whoever leads (host.membership), what its machine remembers across supervisor restarts
(host.machine_record). Here the leader's commands are carried out (`_obey`: messages.Start, Stop,
Park, Retire, Shutdown, Failed, Journal, ActivityRequest; Assign for a spare); the host's end is its
account (host.host_report).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTier
from slicekeeper.supervisor.checkpoints.tiers import CheckpointTiers
from slicekeeper.supervisor.culprit import ActivityTracker
from slicekeeper.supervisor.hang import HangDetector
from slicekeeper.supervisor.host.chaos import Chaos
from slicekeeper.supervisor.host.confinement import Confinement
from slicekeeper.supervisor.host.generation import Generation
from slicekeeper.supervisor.host.host_report import host_report, keep_predecessors_report, write_host_report
from slicekeeper.supervisor.host.leader_duties import LeaderDuties
from slicekeeper.supervisor.host.leadership import Leadership
from slicekeeper.supervisor.host.machine_record import MachineRecord
from slicekeeper.supervisor.host.membership import Membership
from slicekeeper.supervisor.host.sdk_events import SdkEvents
from slicekeeper.supervisor.host.sdk_socket import remove_sdk_socket, sdk_socket_path
from slicekeeper.supervisor.host.site import site_of, spare_index
from slicekeeper.supervisor.host.workload import Workloads, send_sdk_line, workload_argv, workload_env
from slicekeeper.supervisor.leader import Leader
from slicekeeper.supervisor.leader.election import Holder
from slicekeeper.supervisor.leader.job_metrics import JobCollector
from slicekeeper.supervisor.metrics import Role, SupervisorMetrics
from slicekeeper.supervisor.plan import JobPlan
from slicekeeper.supervisor.tls import JobTls

from slicekeeper import protocol
from slicekeeper.credentials import CredentialsError
from slicekeeper.goodput import Category, GoodputAccountant

RETIRED_EXIT_CODE = protocol.EXIT_RETIRED
"""In a pod: retired by the leader, replace this pod (its phase becomes Failed even if the annotation
asking for a replacement could not be written)."""


class HostSupervisor:
    def __init__(
        self,
        plan: JobPlan,
        machine: str,
        host: int | None,
        joined_by: str | None = None,
        *,
        restart: int = 0,
    ) -> None:
        """`host` None: a spare, which takes a host's identity when the leader assigns one
        (`joined_by`: the chaos fault that brought it in, for the report). `restart`: how many
        supervisors ran on this machine before this one (their process died, the machine did not):
        this one serves the host its machine's record names (supervisor.host.machine_record)."""
        self.plan = plan
        self.joined_by = joined_by
        self.machine = machine
        self.restart = restart
        self._dir = plan.machine_dir(machine)
        self._dir.mkdir(parents=True, exist_ok=True)
        (self._dir / "tmp").mkdir(exist_ok=True)  # the workload's TMPDIR locally (host.workload)
        self.record = MachineRecord.of(self._dir)
        host = self.record.claim(host, restarted=restart > 0)
        if restart:
            keep_predecessors_report(self._dir, restart)
        self.host = host if host is not None else -1
        self.job = plan.training_job
        self.layout = plan.layout
        self.identity = self.layout.host(max(self.host, 0))
        self.accountant = GoodputAccountant(time.time(), booked=self._booked)
        self.detector = HangDetector(self.job.spec.health)
        self.activity = ActivityTracker()
        """Where the workload is, for the leader naming a hang's culprit (supervisor.culprit)."""
        self.journal: messages.Journal | None = None
        """The newest journal the leader sent (`{"type": "journal", "seq", "journal"}`)."""
        self.metrics = SupervisorMetrics(lambda: self.accountant)
        self.metrics.export_role(self._role)
        self.metrics.export(JobCollector(lambda: self._leader))
        if not plan.credentials:
            raise CredentialsError("the plan names no directory of the job's credentials")
        self.tls = JobTls(
            Path(plan.credentials),
            refused=lambda port: self.metrics.refused_connections.labels(port=port).inc(),
            say=self._say,
        )
        """The job's credentials: every connection to and from another of its supervisors."""
        persistent = self.job.spec.checkpoint.persistent
        self.tiers = CheckpointTiers(
            plan.machine_disk(machine),
            self.job.spec.checkpoint,
            shape=plan.shape,
            persistent=PersistentTier(persistent.uri, plan.run_key) if persistent else None,
            metrics=self.metrics,
            report=self._report,
            log=self._log,
            tls=self.tls,
        )
        self.tiers.host = host
        if self.tiers.persistent is not None:
            self.metrics.count_store_reads(self.tiers.persistent.reads)
        self.leadership: Leadership | None = None
        self.membership: Membership | None = None
        self._exit_code: int | None = None
        self._finished = asyncio.Event()
        self._world: list[int] = list(range(plan.shape.host_count))
        self._rank = max(self.host, 0)
        self._retired = False
        self._socket_path = sdk_socket_path(self._dir)
        self._tasks: set[asyncio.Task[None]] = set()
        self._events = (self._dir / "events.jsonl").open("a", buffering=1)
        self.site = site_of(plan)
        """Local or pod: decided once (supervisor.host.site)."""
        self._pod = self.site.pod(machine)
        self.duties = LeaderDuties(
            plan,
            self.site,
            persistent=self.tiers.persistent,
            pod=self._pod,
            goodput=lambda: self.accountant.goodput(time.time()),
            spawn=self._spawn_task,
        )
        """What this supervisor does while it leads (supervisor.host.leader_duties)."""
        self.chaos = Chaos(
            plan.chaos,
            host,
            machine=machine,
            record=self.record,
            tiers=self.tiers,
            accountant=lambda: self.accountant,
            kill_workload=lambda: self.workloads.kill(),
            write_report=lambda end: self._write_report(end),
            log=self._log,
            report=self._report,
            spawn=self._spawn_task,
            leading=lambda: self._leader is not None,
        )
        self.workloads = Workloads(
            self._dir / "workload.log",
            argv=workload_argv(self.job.spec.workload, self.site),
            env=self._workload_env,
            site=self.site,
            standby=self.job.spec.workload.standby,
            finished=self._finished,
            send=send_sdk_line,
            log=self._log,
            spawn=self._spawn_task,
            confinement=Confinement(self.site.hidden_from_workload(), say=self._say),
        )
        self.sdk = SdkEvents(
            detector=self.detector,
            activity=self.activity,
            accountant=lambda: self.accountant,
            metrics=self.metrics,
            checkpoint_saved=self.tiers.saved,
            report=self._report,
            log=self._log,
            say=self._say,
            generation=lambda: self.generation.number,
            stopping=lambda: self.generation.stopping,
            standby=lambda: self.workloads.standby,
            step_begun=lambda step: self.chaos.inject(step, self.workloads.current, self.generation.number),
            productive_again=lambda: self._spawn_task(self.workloads.prestart(self.generation.number)),
        )
        self.generation = Generation(
            workloads=self.workloads,
            tiers=self.tiers,
            sdk=self.sdk,
            detector=self.detector,
            accountant=lambda: self.accountant,
            metrics=self.metrics,
            report=self._report,
            log=self._log,
            say=self._say,
            host=lambda: self.host,
            spawn=self._spawn_task,
            finished=self._finished,
        )

    def _spawn_task(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run in the background, holding a reference until done (the loop keeps only weak ones)."""
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        """A supervisor that lost one of its duties must not go on half-blind: stop, loudly."""
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        traceback.print_exception(error, file=sys.stderr)
        self._terminate(f"internal error: {error!r}", exit_code=1)

    def _log(self, record: dict[str, Any]) -> None:
        """Append to this host's event log (what happened, when): for post-mortems and replay."""
        self._events.write(json.dumps({"t": time.time(), **record}) + "\n")

    def _booked(self, category: Category, start: float, end: float) -> None:
        """An interval of this host's time, closed and booked (slicekeeper.goodput): into the event log,
        for the run's page. Dropped once the log is closed (the account was written)."""
        if not self._events.closed:
            interval = {"category": category.value, "start": start, "end": end}
            self._log({"source": "goodput", "type": "interval", **interval})

    def _say(self, text: str) -> None:
        """A line on stderr, naming this host."""
        print(f"[host {self.host}] {text}", file=sys.stderr, flush=True)

    def _workload_env(self, generation: int, coordinator: str, restore_step: int | None) -> dict[str, str]:
        """The workload's environment for a start of `generation` (supervisor.host.workload)."""
        return workload_env(
            self.plan,
            self.job,
            self.layout,
            self.identity,
            site=self.site,
            host=self.host,
            world=self._world,
            rank=self._rank,
            generation=generation,
            coordinator=coordinator,
            restore_step=restore_step,
            socket_path=self._socket_path,
            temp_dir=self._dir / "tmp",
            checkpoint_dir=self.tiers.local_dir,
            slow=self.chaos.slow_spec(),
            environ=os.environ,
            cores=self.site.cores(),
        )

    # --- entry --------------------------------------------------------------------------------
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._terminate, f"received {signum.name}")
        bind = self.site.bind_address()
        metrics_port = self.metrics.serve(self.site.metrics_port(self.host, self.machine), bind)
        self.site.announce_metrics(self.machine, bind, metrics_port)
        sdk_server = await self.sdk.serve(self._socket_path)
        if self.host >= 0:
            # The first generation (or, after a supervisor restart, the restart it rejoins) needs a
            # workload: its imports are done while the hosts gather and the leader decides.
            self._spawn_task(self.workloads.prestart(0))
        advertise = self.site.advertised_address(self.layout, self.identity, bind)
        replica_address = await self.tiers.serve(bind, advertise=advertise)
        self.leadership = self._leadership(bind, advertise)
        campaign = self._spawn_task(self.leadership.run())
        hello = {"metrics_port": metrics_port, "pid": os.getpid(), "machine": self.machine}
        hello["replica_address"] = replica_address
        watchdog = self._spawn_task(self.generation.hangs.run())
        try:
            await self._follow_leaders(hello)
        finally:
            watchdog.cancel()
            self.workloads.drop_standby()
            await self.workloads.stop()
            sdk_server.close()
            remove_sdk_socket(self._socket_path, self._dir)
            await self.tiers.close()
            self._write_report()
            leader = self._leader
            if leader is not None:
                await self.duties.publish_last(leader, self.leadership.sure)
            self.duties.end()
            campaign.cancel()
            if leader is not None:
                await self.leadership.release()
                await leader.close()
        return self._exit_code if self._exit_code is not None else 1

    def _role(self) -> Role:
        """Which host of the job this machine plays now (none: a waiting spare), for the metrics."""
        if self.host < 0:
            return Role(self.machine, None)
        return Role(self.machine, self.host, self.identity.slice, self.identity.worker)

    @property
    def _leader(self) -> Leader | None:
        """The job's leader, while this supervisor leads (supervisor.host.leadership)."""
        return self.leadership.leader if self.leadership is not None else None

    def _leadership(self, bind: str, advertise: str) -> Leadership:
        address, reserved = self.site.leader_address(self.host, advertise)
        own = Holder(self.machine, self.host, address)
        leadership = Leadership(
            self.site.election(own),
            own,
            candidate=self.host >= 0,
            first=self.host == 0 and self.joined_by is None,
            successor=self.restart > 0,
            new_leader=self.duties.new_leader,
            journal=lambda: self.journal,
            bind=bind,
            reserved=reserved,
            tls=self.tls,
            say=self._say,
        )
        leadership.elected, leadership.deposed = self.duties.begin, self.duties.end
        return leadership

    def _terminate(self, reason: str, exit_code: int = 130) -> None:
        self._exit_code = exit_code
        self.accountant.interrupt(time.time())
        self.workloads.kill()
        self._say(f"stopping: {reason}")
        if self._leader is not None:  # before its own member's connection drops
            self._leader.stand_down(reason)
            # It acts no more: the lease goes to the next candidate now, not once this process ends
            # (a pod's grace period may end it first).
            if self.leadership is not None:
                self._spawn_task(self.leadership.release())
        if self.membership is not None:
            self.membership.close()
        self._finished.set()

    async def _report(self, message: messages.MemberReport) -> None:
        """Every report of this host's parts leaves through here, stamped with the host it serves."""
        if self.membership is not None:
            await self.membership.report(message.model_copy(update={"host": self.host}))

    # --- the leader's commands ----------------------------------------------------------------
    async def _follow_leaders(self, hello: dict[str, Any]) -> None:
        """Join the job's leader and carry out its commands; rejoin the next one when it is lost
        (supervisor.host.membership)."""
        assert self.leadership is not None
        self.membership = Membership(
            self.leadership,
            wait=self.site.leader_wait,
            unreachable_exit_code=self.site.leader_unreachable_exit_code,
            finished=self._finished,
            say=self._say,
        )
        await self.membership.run(
            lambda rejoining: self._registration(hello, rejoining),
            obey=self._obey,
            assigned=lambda assign: self._adopt(assign.host, set(assign.fired)),
        )
        if self._exit_code is None:
            self._exit_code = self.membership.exit_code

    def _registration(
        self, hello: dict[str, Any], rejoining: bool
    ) -> messages.Register | messages.RegisterSpare:
        """How this supervisor joins a leader: as a spare, as a host, or as a host rejoining after
        its leader was lost (with what a leader taking over needs from it)."""
        if self.host < 0:
            return messages.RegisterSpare(spare=spare_index(self.machine), chaos=self.joined_by, **hello)
        if not rejoining:
            return messages.Register(host=self.host, **hello, restarted=self.restart > 0)
        return messages.Register(
            host=self.host,
            **hello,
            journal=self.journal,
            generation=self.generation.number,
            step=self.accountant.high_water,
            parked=self.generation.parked,
        )

    def _adopt(self, host: int, fired: set[str]) -> None:
        """Become `host`: its identity, its chaos faults not yet fired, a fresh account of time."""
        self.host = host
        self.identity = self.layout.host(host)
        self.tiers.host = host
        self.record.serve(host)
        self.chaos.aim_at(host, fired)
        if self.leadership is not None and not self.leadership.candidate:  # a spare: a candidate now
            own = Holder(self.machine, host, self.leadership.own.address)
            self.leadership.adopt(self.site.election(own), own)
        self.accountant = GoodputAccountant(time.time(), booked=self._booked)
        self.accountant.switch(Category.INFRASTRUCTURE_RECOVERY, time.time())
        self._log({"source": "leader", "type": "assign", "host": host, "machine": self.machine})
        print(f"[{self.machine}] taking over host {host}", file=sys.stderr, flush=True)

    async def _obey(self, command: messages.Command) -> bool:
        """Carry out one of the leader's commands; True: this host's part in the job ended."""
        match command:
            case messages.Start() as start:
                self._world, self._rank = list(start.world), start.rank
                await self.generation.start(start, self._world)
            case messages.Stop() as stop:  # the fault is this host's when the leader named it so
                await self.generation.stop(stop, blamed=stop.host == self.host)
            case messages.Journal() as journal:
                self.journal = journal  # the leader's newest: what a leader taking over carries on
            case messages.ActivityRequest():
                snapshot = self.activity.snapshot(time.time()).to_message()
                await self._report(messages.ActivityReport(generation=self.generation.number, **snapshot))
            case messages.Park() as park:
                self.generation.park(park)
            case messages.Retire(reason=reason):
                await self._retire(reason)
                return True
            case messages.Shutdown():
                self._exit_code = 0
                return True
            case messages.Failed(reason=reason):
                self.accountant.interrupt(time.time())
                self._say(f"job failed: {reason}")
                self._exit_code = 1
                return True
            case messages.Assign():
                pass  # only a spare waiting for a host is assigned one
        return False

    async def _retire(self, reason: str) -> None:
        """The leader replaced this machine while it was alive (e.g. a straggler): end, cleanly."""
        self.workloads.drop_standby()
        await self.workloads.stop()
        self.accountant.interrupt(time.time())
        self._retired = True
        self._exit_code = 0
        if self._pod is not None:
            await self._pod.ask_replacement(reason)
            self._exit_code = RETIRED_EXIT_CODE
        self._log({"source": "leader", "type": "retire", "reason": reason})
        print(f"[{self.machine}] retired: {reason}", file=sys.stderr, flush=True)

    # --- the end ------------------------------------------------------------------------------
    def _write_report(self, end: str | None = None) -> None:
        """This supervisor's account; `end`: "lost" (its machine gone) or "crashed" (this process)."""
        now = time.time()
        self.accountant.book_open(now)  # the account's last interval, in the event log too
        report = host_report(
            machine=self.machine,
            end=end,
            retired=self._retired,
            host=self.host,
            identity=self.identity,
            accountant=self.accountant,
            generation=self.generation,
            journal=self.journal,
            sdk=self.sdk,
            detector=self.detector,
            tiers=self.tiers,
            exit_code=self._exit_code,
            now=now,
        )
        write_host_report(self._dir, report)
        self._events.close()
