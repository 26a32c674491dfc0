"""The host a supervisor serves: its parts, built once the host is known and fixed from then on.

A host's supervisor knows its host at its start; a spare learns it when the leader assigns one
(supervisor.host.spare). Either way the parts serving the host are built then, each handed the same
frozen context (supervisor.host.context): the workload process and its standby (host.workload), what
its workloads start with (host.workload_starts), the SDK's events (host.sdk_events), the restart
generation with its exit and hang watches (host.generation, host.detectors), the chaos faults aimed
at the host (host.chaos). Here the leader's commands to a host are carried out (`obey`:
messages.Start, Stop, Park, Journal, ActivityRequest), the host says how it joins a leader, and its
account is made (host.host_report).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoints.tiers import CheckpointTiers
from slicekeeper.supervisor.host.chaos import Chaos
from slicekeeper.supervisor.host.confinement import Confinement
from slicekeeper.supervisor.host.context import HostContext
from slicekeeper.supervisor.host.generation import Generation
from slicekeeper.supervisor.host.host_report import host_report
from slicekeeper.supervisor.host.machine_record import MachineRecord
from slicekeeper.supervisor.host.notices import SigtermNotice, save_on_notice
from slicekeeper.supervisor.host.relay import END_WAIT_SECONDS, Relay
from slicekeeper.supervisor.host.sdk_events import SdkEvents
from slicekeeper.supervisor.host.sdk_socket import remove_sdk_socket
from slicekeeper.supervisor.host.workload import Workloads
from slicekeeper.supervisor.host.workload_starts import WorkloadStarts
from slicekeeper.supervisor.leader.journal import received
from slicekeeper.supervisor.signals.culprit import ActivityTracker, process_state
from slicekeeper.supervisor.signals.hang import HangDetector
from slicekeeper.supervisor.tls import JobTls

from slicekeeper.chaos import COLLECTIVE
from slicekeeper.goodput import GoodputAccountant
from slicekeeper.shape import HostId


class ServedHost:
    """A supervisor's mode once it serves a host: the host's parts, each with the host's context."""

    def __init__(
        self,
        context: HostContext,
        *,
        tls: JobTls | None,
        tiers: CheckpointTiers,
        record: MachineRecord,
        fired: set[str],
        restarted: bool,
        write_report: Callable[[str], None],
        leading: Callable[[], bool],
    ) -> None:
        """`tls`: the job's credentials (the relay's connections); `tiers`: the machine's checkpoint
        tiers, now holding this host's shards; `record`: the
        machine's (supervisor.host.machine_record); `fired`: this host's chaos faults already fired
        elsewhere (a spare taking over); `restarted`: a supervisor served this host on this machine
        before this one; `write_report(end)`: the supervisor's account, written by a chaos fault
        that ends it; `leading`: whether this supervisor leads the job now."""
        self.context = context
        self._tiers = tiers
        control = context.plan.training_job.spec.control_plane
        self.relay = (
            Relay(
                context.plan.shape.relay_group_of(context.host, control.hosts_per_relay),
                host=context.host,
                tls=tls,
                deadline=context.plan.training_job.spec.health.connection_deadline_seconds,
                say=context.say,
            )
            if control.relays
            else None
        )
        """This host's relay for its group's members (spec.controlPlane.relays; None: none)."""
        self._restarted = restarted
        self.journal: messages.Journal | None = None
        """The newest journal the leader sent: what a leader taking over carries on."""
        self.retired = False
        self._hang_watch: asyncio.Task[None] | None = None
        self.detector = HangDetector(context.plan.training_job.spec.health)
        self.sigterm = SigtermNotice(
            context, float(context.plan.training_job.spec.disruption.termination_grace_period_seconds)
        )
        self.activity = ActivityTracker()
        """Where the workload is, for the leader naming a hang's culprit (supervisor.signals.culprit)."""
        confinement = Confinement(context.site.hidden_from_workload(), say=context.say)
        self.workloads = Workloads(context, confinement=confinement)
        self.chaos = Chaos(
            context,
            record=record,
            tiers=tiers,
            fired=fired,
            kill_workload=self.workloads.kill,
            write_report=write_report,
            leading=leading,
            relaying=lambda: self.relay is not None and bool(self.relay.upstreams()),
        )
        self._starts = WorkloadStarts(
            context, workloads=self.workloads, chaos=self.chaos, checkpoint_dir=tiers.local_dir
        )
        self.sdk = SdkEvents(
            context,
            detector=self.detector,
            activity=self.activity,
            checkpoint_saved=tiers.saved,
            standby=self._starts.standby,
            step_begun=self._step_begun,
            productive_again=self._starts.prestart,
            work_done=self._work_done,
        )
        self.generation = Generation(
            context, workloads=self.workloads, tiers=tiers, sdk=self.sdk, detector=self.detector
        )

    @property
    def host(self) -> int:
        return self.context.host

    @property
    def identity(self) -> HostId:
        return self.context.identity

    @property
    def accountant(self) -> GoodputAccountant:
        return self.context.accountant

    def _step_begun(self, step: int) -> None:
        self.chaos.inject(step, self.workloads.current, self.generation.number)

    def _work_done(self, step: int) -> None:
        self.chaos.inject(step, self.workloads.current, self.generation.number, at=COLLECTIVE)

    def workload_env(self, start: messages.Start) -> dict[str, str]:
        """The workload's environment for `start`, from what this host holds (supervisor.host.workload)."""
        return self._starts.env(start)

    # --- serving ------------------------------------------------------------------------------
    async def begin(self, *, prestart: bool) -> None:
        """Listen to the workload's SDK and watch for hangs; `prestart`: the first generation (or,
        after a supervisor restart, the restart it rejoins) needs a workload, whose imports are done
        while the hosts gather and the leader decides."""
        await self.sdk.serve(self._starts.socket)
        if prestart:
            self._starts.prestart()
        self._hang_watch = self.context.spawn(self.generation.hangs.run())
        if self.relay is not None:
            site, host = self.context.site, self.context.host
            try:
                await self.relay.serve(site.bind_address(), site.relay_port(host))
            except OSError as error:  # its port still held (a partitioned predecessor, locally)
                self.context.say(f"relay of host {host} not served: {error}; its group uses the next one")

    async def end(self) -> None:
        """The supervisor ends: the workload and its standby stopped, the SDK socket gone."""
        if self._hang_watch is not None:
            self._hang_watch.cancel()
        self.workloads.drop_standby()
        await self.workloads.stop()
        if self.relay is not None:
            await self.relay.close(wait=END_WAIT_SECONDS)
        self.sdk.close()
        remove_sdk_socket(self._starts.socket, self.context.folder)

    def interrupt(self) -> None:
        """The supervisor stops at once: the time accounted so far, the workload SIGKILLed."""
        self.context.accountant.interrupt(time.time())
        self.workloads.kill()

    def registration(self, hello: dict[str, Any], rejoining: bool) -> messages.Register:
        """How this host joins a leader: at its start, or rejoining after its leader was lost (with
        what a leader taking over needs from it)."""
        if not rejoining:
            return messages.Register(host=self.host, **hello, restarted=self._restarted)
        return messages.Register(
            host=self.host,
            **hello,
            journal=self.journal,
            generation=self.generation.number,
            step=self.context.accountant.high_water,
            parked=self.generation.parked,
        )

    # --- the leader's commands to a host ------------------------------------------------------
    async def obey(self, command: messages.Command) -> None:
        match command:
            case messages.Start() as start:
                await self.generation.start(start, self._starts.started(start))
            case messages.Stop() as stop:  # the fault is this host's when the leader named it so
                await self.generation.stop(stop, blamed=stop.host == self.host)
            case messages.Journal() as journal:
                # the leader's newest: what a leader taking over carries on
                self.journal = received(self.journal, journal)
            case messages.ActivityRequest():
                process = process_state(self.workloads.current.pid if self.workloads.current else None)
                snapshot = self.activity.snapshot(time.time(), process).to_message()
                await self.context.report(
                    messages.ActivityReport(generation=self.generation.number, **snapshot)
                )
            case messages.Park() as park:
                self.generation.park(park)
            case messages.SaveAt() as order:
                self.sigterm.answered.set()
                self.context.spawn(save_on_notice(order, self.context, self.sdk, self._tiers))

    async def retire(self) -> None:
        """The leader replaced this machine while it was alive (e.g. a straggler): the workload ends."""
        self.workloads.drop_standby()
        await self.workloads.stop()
        self.context.accountant.interrupt(time.time())
        self.retired = True

    def account(
        self, *, machine: str, end: str | None, tiers: CheckpointTiers, exit_code: int | None, now: float
    ) -> dict[str, Any]:
        return host_report(
            machine=machine,
            end=end,
            retired=self.retired,
            identity=self.identity,
            accountant=self.context.accountant,
            generation=self.generation,
            journal=self.journal,
            sdk=self.sdk,
            detector=self.detector,
            tiers=tiers,
            exit_code=exit_code,
            now=now,
        )
