"""One machine's supervisor: join the job's leader, follow its commands, serve a host.

`HostSupervisor` owns what belongs to the machine and its process, and outlives any change of role:
its folder and event log (supervisor.reporting.EventLog), its metrics, the job's credentials, its
share of the checkpoint tiers (their server is the replica address a leader hands on), its part in
the election and what it does while it leads (host.leadership), its connection to whoever leads
(host.membership), its background tasks. What it serves is its mode: a spare waiting to be assigned
a host (host.spare), or one host, whose parts are built once the host is known and fixed from then
on (host.served_host, with one frozen host.context). A spare assigned a host (messages.Assign, on
the connection it registered on) becomes that host's supervisor, keeping the machine's parts. Here
the commands that end the supervisor's part are carried out (messages.Retire, Shutdown, Failed) and
its account is written at its end (host.host_report).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import traceback
from collections.abc import Coroutine
from functools import partial
from pathlib import Path
from typing import Any

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTier
from slicekeeper.supervisor.checkpoints.tiers import CheckpointTiers
from slicekeeper.supervisor.host import notices, who_leads
from slicekeeper.supervisor.host.context import HostContext
from slicekeeper.supervisor.host.host_report import keep_predecessors_report, write_host_report
from slicekeeper.supervisor.host.leadership import LeaderDuties, Leadership
from slicekeeper.supervisor.host.machine_record import MachineRecord
from slicekeeper.supervisor.host.membership import Membership
from slicekeeper.supervisor.host.served_host import ServedHost
from slicekeeper.supervisor.host.site import site_of
from slicekeeper.supervisor.host.spare import Spare
from slicekeeper.supervisor.leader import Leader
from slicekeeper.supervisor.leader.election import Holder
from slicekeeper.supervisor.leader.job_metrics import JobCollector
from slicekeeper.supervisor.metrics import Role, SupervisorMetrics
from slicekeeper.supervisor.plan import JobPlan
from slicekeeper.supervisor.pod.own_pod import OwnPod
from slicekeeper.supervisor.pod.pod_notices import PodNotice, seconds_left, watch_notices
from slicekeeper.supervisor.reporting import EventLog
from slicekeeper.supervisor.tls import JobTls

from slicekeeper import protocol
from slicekeeper.credentials import CredentialsError
from slicekeeper.goodput import Category, GoodputAccountant
from slicekeeper.shape import HostId

RETIRED_EXIT_CODE = protocol.EXIT_RETIRED
"""In a pod: retired by the leader, replace this pod (its phase becomes Failed even if the annotation
asking for a replacement could not be written)."""

SPARE_HOLDER = -1
"""The host a spare's lease identity names (supervisor.leader.election.Holder): none. A spare only
reads the lease until it serves a host."""


class HostSupervisor:
    def __init__(
        self,
        plan: JobPlan,
        machine: str,
        host: HostId | None,
        joined_by: str | None = None,
        *,
        restart: int = 0,
    ) -> None:
        """`host`: the host served, of the plan's layout; None: a spare, which serves a host once the
        leader assigns one (`joined_by`: the chaos fault that brought it in, for the report).
        `restart`: how many supervisors ran on this machine before this one (their process died, the
        machine did not): this one serves the host its machine's record names
        (supervisor.host.machine_record)."""
        self.machine = machine
        self._joined_by = joined_by
        self._restarted = restart > 0
        self._folder = plan.machine_dir(machine)
        self._folder.mkdir(parents=True, exist_ok=True)
        (self._folder / "tmp").mkdir(exist_ok=True)  # the workload's TMPDIR locally (host.workload)
        record = MachineRecord.of(self._folder)
        claimed = record.claim(None if host is None else host.index, restarted=self._restarted)
        if claimed is not None and (host is None or host.index != claimed):
            host = plan.layout.host(claimed)  # the host the machine's record names
        if restart:
            keep_predecessors_report(self._folder, restart)
        self.site = site_of(plan)
        """Local or pod: decided once (supervisor.host.site)."""
        self._events = EventLog(self._folder / "events.jsonl")
        self._mode: Spare | ServedHost
        """What this machine serves: nothing yet (a spare), or one host."""
        self.metrics = SupervisorMetrics(self._accountant)
        self.metrics.export_role(self._role)
        self.metrics.export(JobCollector(self._leading))
        if not plan.credentials:
            raise CredentialsError("the plan names no directory of the job's credentials")
        self.tls = JobTls(
            Path(plan.credentials),
            refused=self.metrics.refused,
            say=self._say,
        )
        """The job's credentials: every connection to and from another of its supervisors."""
        persistent = plan.training_job.spec.checkpoint.persistent
        self.tiers = CheckpointTiers(
            plan.machine_disk(machine),
            plan.training_job.spec.checkpoint,
            shape=plan.shape,
            persistent=PersistentTier(
                persistent.uri,
                plan.run_key,
                call_timeout=persistent.call_timeout_seconds,
                attempts=persistent.attempts,
            )
            if persistent
            else None,
            metrics=self.metrics,
            report=self._report,
            log=self._events.log,
            tls=self.tls,
            connection_deadline=plan.training_job.spec.health.connection_deadline_seconds,
        )
        self.tiers.host = claimed
        if self.tiers.persistent is not None:
            self.metrics.count_store_reads(self.tiers.persistent.reads)
        self.leadership: Leadership | None = None
        self.membership: Membership | None = None
        self._exit_code: int | None = None
        self._finished = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        if host is None:
            self._mode = Spare(
                machine, self._folder, joined_by=joined_by, record=record, booked=self._events.booked
            )
        else:
            accountant = GoodputAccountant(time.time(), booked=self._events.booked)
            self._mode = self._serve(host, accountant, record=record, fired=set())

    def _serve(
        self, host: HostId, accountant: GoodputAccountant, *, record: MachineRecord, fired: set[str]
    ) -> ServedHost:
        """The parts serving `host`, from now on (`fired`: its chaos faults fired elsewhere)."""
        context = HostContext(
            plan=self.site.plan,
            site=self.site,
            identity=host,
            machine=self.machine,
            folder=self._folder,
            accountant=accountant,
            metrics=self.metrics,
            log=self._events.log,
            report=self._report,
            say=self._say,
            spawn=self._spawn_task,
            finished=self._finished,
        )
        served = ServedHost(
            context,
            tls=self.tls,
            tiers=self.tiers,
            record=record,
            fired=fired,
            restarted=self._restarted,
            write_report=self._write_report,
            leading=self._leads,
        )
        if served.relay is not None:  # its relay port also answers who leads
            served.relay.lease_seen = lambda: who_leads.seen(
                self.leadership.lease if self.leadership else None
            )
        return served

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

    def _say(self, text: str) -> None:
        """A line on stderr, naming the host this machine serves (a spare: the machine)."""
        host = self._mode.host
        print(f"[{self.machine if host is None else f'host {host}'}] {text}", file=sys.stderr, flush=True)

    def _accountant(self) -> GoodputAccountant:
        """The account of this machine's time as what it serves now, for the metrics (a spare that
        takes a host over starts a fresh one)."""
        return self._mode.accountant

    def _role(self) -> Role:
        """Which host of the job this machine plays now (none: a waiting spare), for the metrics."""
        identity = self._mode.identity
        if identity is None:
            return Role(self.machine, None)
        return Role(self.machine, identity.index, identity.slice, identity.worker)

    def _leading(self) -> Leader | None:
        """The job's leader, while this supervisor leads (supervisor.host.leadership)."""
        return self.leadership.leader if self.leadership is not None else None

    def _leads(self) -> bool:
        return self._leading() is not None

    def _goodput(self) -> float:
        return self._mode.accountant.goodput(time.time())

    def _journal(self) -> messages.Journal | None:
        """The newest journal the leader sent this host (a spare has none)."""
        return self._mode.journal

    # --- entry --------------------------------------------------------------------------------
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._sigterm)
        loop.add_signal_handler(signal.SIGINT, self._terminate, "received SIGINT")
        bind = self.site.bind_address()
        metrics_port = self.metrics.serve(self.site.metrics_port(self._mode.host, self.machine), bind)
        self.site.announce_metrics(self.machine, bind, metrics_port)
        if isinstance(self._mode, ServedHost):
            await self._mode.begin(prestart=True)
        advertise = self.site.advertised_address(self.site.plan.layout, self._mode.identity, bind)
        replica_address = await self.tiers.serve(bind, advertise=advertise)
        self.leadership, duties = self._leadership(bind, advertise)
        campaign = self._spawn_task(self.leadership.run())
        self._watch_own_pod()
        hello = {"metrics_port": metrics_port, "pid": os.getpid(), "machine": self.machine}
        hello["replica_address"] = replica_address
        try:
            await self._follow_leaders(hello)
        finally:
            await self._mode.end()
            await self.tiers.close()
            self._write_report()
            leader = self._leading()
            if leader is not None:
                await duties.publish_last(leader, self.leadership.sure)
            duties.end()
            campaign.cancel()
            if leader is not None:
                await self.leadership.release()
                await leader.close()
        return self._exit_code if self._exit_code is not None else 1

    def _leadership(self, bind: str, advertise: str) -> tuple[Leadership, LeaderDuties]:
        """This supervisor's part in the election, and what it does while it leads."""
        host = self._mode.host
        address, reserved = self.site.leader_address(host, advertise)
        own = Holder(self.machine, SPARE_HOLDER if host is None else host, address)
        duties = LeaderDuties(
            self.site.plan,
            self.site,
            persistent=self.tiers.persistent,
            pod=self.site.pod(self.machine),
            goodput=self._goodput,
            spawn=self._spawn_task,
        )
        candidates = self.site.lease_candidates()
        asked = [self.site.relay_address(h) for h in candidates or () if h != host]
        leadership = Leadership(
            self.site.election(own),
            own,
            candidate=host is not None and (candidates is None or host in candidates),
            first=host == 0 and self._joined_by is None,
            successor=self._restarted,
            new_leader=duties.new_leader,
            journal=self._journal,
            bind=bind,
            reserved=reserved,
            tls=self.tls,
            ask=None if candidates is None else partial(who_leads.ask_candidates, asked, self.tls),
            say=self._say,
        )
        leadership.elected, leadership.deposed = duties.begin, duties.end
        return leadership, duties

    def _watch_own_pod(self) -> None:
        """In a pod: the operator's notices of this machine's loss, passed on to the leader."""
        served, own = self._mode, OwnPod.from_env(os.environ)
        if not isinstance(served, ServedHost) or own is None or self.site.pod(self.machine) is None:
            return  # locally, chaos announces; a spare has no host to hand over yet

        async def announce(notice: PodNotice) -> None:
            source = notice.source or f"the pod's {protocol.ANNOTATION_NOTICE} annotation"
            await notices.announce(served.context, notice.kind, seconds_left(notice), source)

        self._spawn_task(watch_notices(own, announce, self._say))

    def _sigterm(self) -> None:
        """In a cluster a member's SIGTERM is its pod being deleted with a grace period (a preemption,
        a drained node): a notice to the leader first, which may save and hand the host over within
        the grace (supervisor.host.notices). A leader's, a second one, or one outside a pod: the end."""
        served = self._mode
        if (
            isinstance(served, ServedHost)
            and not served.sigterm.begun
            and not served.retired  # its host is served elsewhere now: nothing to hand over
            and self._leading() is None
            and self.membership is not None
            and self.site.pod(self.machine) is not None
        ):
            self._spawn_task(self._hand_over_then_end(served))
            return
        self._terminate("received SIGTERM")

    async def _hand_over_then_end(self, served: ServedHost) -> None:
        await served.sigterm.hand_over(self._finished)
        if not self._finished.is_set():
            self._terminate("received SIGTERM")

    def _terminate(self, reason: str, exit_code: int = 130) -> None:
        self._exit_code = exit_code
        self._mode.interrupt()
        self._say(f"stopping: {reason}")
        leader = self._leading()
        if leader is not None:  # before its own member's connection drops
            leader.stand_down(reason)
            # It acts no more: the lease goes to the next candidate now, not once this process ends
            # (a pod's grace period may end it first).
            if self.leadership is not None:
                self._spawn_task(self.leadership.release())
        if self.membership is not None:
            self.membership.close()
        self._finished.set()

    async def _report(self, message: messages.MemberReport) -> None:
        """Every report of this machine's parts leaves through here, stamped with the host it serves
        (a spare serves none, and has nothing to report)."""
        host = self._mode.host
        if self.membership is not None and host is not None:
            await self.membership.report(message.model_copy(update={"host": host}))

    # --- the leader's commands ----------------------------------------------------------------
    async def _follow_leaders(self, hello: dict[str, Any]) -> None:
        """Join the job's leader and carry out its commands; rejoin the next one when it is lost
        (supervisor.host.membership)."""
        assert self.leadership is not None
        self.membership = Membership(
            self.leadership,
            self.site,
            finished=self._finished,
            say=self._say,
            connection_deadline=self.site.plan.training_job.spec.health.connection_deadline_seconds,
            relays=lambda: self.site.relays(self._mode.host),
        )
        await self.membership.run(
            hello,
            self._mode_registration,
            obey=self._obey,
            assigned=self._assigned,
        )
        if self._exit_code is None:
            self._exit_code = self.membership.exit_code

    def _mode_registration(
        self, hello: dict[str, Any], rejoining: bool
    ) -> messages.Register | messages.RegisterSpare:
        """How this machine joins a leader: as the host it serves, or as a spare."""
        return self._mode.registration(hello, rejoining)

    async def _assigned(self, assign: messages.Assign) -> None:
        """This spare serves `assign.host` from now on: the host's chaos faults not fired yet, a fresh
        account of time (recovering, as the host it takes over is), the host's parts."""
        spare = self._mode
        assert isinstance(spare, Spare), "only a spare waiting for a host is assigned one"
        host = assign.host
        self.tiers.host = host
        spare.record.serve(host)
        candidates = self.site.lease_candidates()
        if self.leadership is not None and not self.leadership.candidate:  # the host's part from now on
            own = Holder(self.machine, host, self.leadership.own.address)
            self.leadership.adopt(self.site.election(own), own, candidates is None or host in candidates)
        accountant = GoodputAccountant(time.time(), booked=self._events.booked)
        accountant.switch(Category.INFRASTRUCTURE_RECOVERY, time.time())
        identity = self.site.plan.layout.host(host)
        self._mode = self._serve(identity, accountant, record=spare.record, fired=set(assign.fired))
        self._events.log({"source": "leader", "type": "assign", "host": host, "machine": self.machine})
        print(f"[{self.machine}] taking over host {host}", file=sys.stderr, flush=True)
        await self._mode.begin(prestart=False)

    async def _obey(self, command: messages.Command) -> bool:
        """Carry out one of the leader's commands; True: this host's part in the job ended."""
        served = self._mode
        assert isinstance(served, ServedHost), "a spare is given commands only once it serves a host"
        match command:
            case messages.Retire(reason=reason):
                await self._retire(served, reason)
                return True
            case messages.Shutdown():
                self._exit_code = 0
                return True
            case messages.Failed(reason=reason):
                served.accountant.interrupt(time.time())
                self._say(f"job failed: {reason}")
                self._exit_code = 1
                return True
            case messages.Assign():
                pass  # only a spare waiting for a host is assigned one
            case _:
                await served.obey(command)
        return False

    async def _retire(self, served: ServedHost, reason: str) -> None:
        """The leader replaced this machine while it was alive (e.g. a straggler): end, cleanly."""
        await served.retire()
        self._exit_code = 0
        pod = self.site.pod(self.machine)
        if pod is not None:
            await pod.ask_replacement(reason)
            self._exit_code = RETIRED_EXIT_CODE
        self._events.log({"source": "leader", "type": "retire", "reason": reason})
        print(f"[{self.machine}] retired: {reason}", file=sys.stderr, flush=True)

    # --- the end ------------------------------------------------------------------------------
    def _write_report(self, end: str | None = None) -> None:
        """This supervisor's account; `end`: "lost" (its machine gone) or "crashed" (this process)."""
        now = time.time()
        self._mode.accountant.book_open(now)  # the account's last interval, in the event log too
        account = self._mode.account(
            machine=self.machine, end=end, tiers=self.tiers, exit_code=self._exit_code, now=now
        )
        if self.leadership is not None:  # the job's cost to the API server, this supervisor's part
            account["lease_requests"] = self.leadership.lease_requests
        write_host_report(self._folder, account)
        self._events.close()
