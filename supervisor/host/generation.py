"""This host's part of the restart protocol: the generation it is in, started, stopped or parked.

The leader runs the job in restart generations (docs/architecture.md): `start` every host from one
restore step, `stop` every host at a fault, then start the next generation. Here is what one host
does at each: a start stages this host's shard of the restore step from the first tier holding a
valid copy, launches the generation's workload (the standby, if one is ready) and watches its exit;
a stop kills the workload's whole process group and tells the leader what this machine holds; a
park (the host's slice dropped by a scale-down) leaves it idle, accounted as `scaled_down`, until a
scale-up starts it again. A workload's word counts only while its generation is current.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoint_vocabulary import RestoreSource
from slicekeeper.supervisor.checkpoints.restore_plan import describe
from slicekeeper.supervisor.checkpoints.tiers import CheckpointTiers
from slicekeeper.supervisor.host.context import HostContext
from slicekeeper.supervisor.host.detectors import ExitWatch, HangWatch
from slicekeeper.supervisor.host.sdk_events import SdkEvents
from slicekeeper.supervisor.host.workload import Workloads
from slicekeeper.supervisor.signals.hang import HangDetector

from slicekeeper.goodput import Category
from slicekeeper.policy.events import FaultKind


class Generation:
    """The restart generation this host is in, the leader's start, stop and park carried out, and the
    watches on the generation's workload (its exit, its silence)."""

    def __init__(
        self,
        context: HostContext,
        *,
        workloads: Workloads,
        tiers: CheckpointTiers,
        sdk: SdkEvents,
        detector: HangDetector,
    ) -> None:
        """`detector`: judges the workload's silence (supervisor.signals.hang)."""
        self._context = context
        self._workloads = workloads
        self._tiers = tiers
        self._sdk = sdk
        self.number = -1
        self._acked: int | None = None
        """The generation whose stop this host acknowledged last."""
        self.stopping = False
        """The current generation is being stopped (or this host is parked): its workload's word no
        longer counts."""
        self.parked = False
        """This host's slice was dropped by a scale-down: it idles until a start brings it back."""
        self.restarts: dict[str, int] = {}
        """Generations stopped, by the kind of fault that stopped them."""
        self.faults: dict[str, int] = {}
        """Faults the leader attributed to this host, by kind (`slicekeeper_host_faults_total`)."""
        self.exits = ExitWatch(
            report=context.report,
            accountant=context.accountant,
            drain=tiers.drain,  # the final checkpoint reaches the peer and persistent tiers
            sdk_read=sdk.eof,
            done=lambda: sdk.done,
            current=self.is_current,
        )
        self.hangs = HangWatch(detector, context.metrics, report=context.report, watched=self.watched)

    def is_current(self, generation: int) -> bool:
        """Whether `generation` runs, not being stopped, and the supervisor is not ending."""
        return not (self.stopping or generation != self.number or self._context.finished.is_set())

    def watched(self) -> int | None:
        """The generation whose workload runs and is not being stopped (None: nothing to watch)."""
        workload = self._workloads.current
        if workload is None or not workload.running or self.stopping:
            return None
        return self.number

    async def start(self, message: messages.Start, env: dict[str, str]) -> None:
        """The leader's `start`: the generation, the restore step (None: from scratch) and where to
        stage it from, the replica holders' addresses, the hosts taking part; `env`: the workload's
        environment for it (supervisor.host.workload.workload_env)."""
        generation, restore_step = message.generation, message.restore_step
        self.parked = False
        addresses = dict(message.replica_addresses)
        world = message.hosts
        self._tiers.start_generation(generation, addresses, world)
        await self._start(generation, restore_step, message.sources, len(world), env)

    async def _start(
        self,
        generation: int,
        restore_step: int | None,
        sources: Sequence[RestoreSource],
        host_count: int,
        env: dict[str, str],
    ) -> None:
        now = time.time()
        self._sdk.drop_checkpoints_after(restore_step)  # before the generation moves
        self.number = generation
        self._context.metrics.generation.set(generation)
        self.stopping = False
        self.hangs.rearm()
        self._context.accountant.switch(
            Category.PROGRAM_STARTUP if generation == 0 else Category.INFRASTRUCTURE_RECOVERY, now
        )
        self._sdk.begin(generation, restore_step, now, host_count=host_count)
        self._context.log(
            {"source": "leader", "type": "start", "generation": generation, "restore_step": restore_step}
        )
        self._tiers.discard_after(restore_step)
        if restore_step is not None and not await self._stage(generation, restore_step, sources):
            return
        try:
            workload = await self._workloads.launch(generation, env)
        except OSError as error:
            detail = f"cannot start the workload {self._workloads.argv[0]!r}: {error.strerror or error}"
            await self._context.report(
                messages.Fault(generation=generation, kind=FaultKind.CRASH, detail=detail)
            )
            return
        self._context.accountant.switch(Category.PROGRAM_STARTUP, time.time())
        await self._context.report(messages.StateReport(state="starting"))
        self._context.spawn(self.exits.watch(workload, generation))

    async def _stage(self, generation: int, step: int, sources: Sequence[RestoreSource]) -> bool:
        """This host's shard of the restore step into the local tier, from the first of `sources` that
        holds a valid copy; False: none did (a fault said so)."""
        self._context.accountant.switch(Category.CHECKPOINT_RESTORE, time.time())
        staged = await self._tiers.stage(step, sources)
        if staged is None:
            tried = ", ".join(describe(source) for source in sources)
            host = self._context.host
            detail = f"no valid copy of host {host}'s shard of step {step} (tried: {tried or 'nothing'})"
            await self._context.report(
                messages.CheckpointInvalid(step=step, tier="any", reason="restore failed", detail=detail)
            )
            await self._context.report(
                messages.Fault(generation=generation, kind=FaultKind.RESTORE_FAILED, detail=detail)
            )
            return False
        self._sdk.check_restored_steps()
        await self._context.report(
            messages.Restored(
                step=step,
                tier=staged.tier.value,
                holder=staged.holder,
                seconds=round(staged.seconds, 4),
                bytes=staged.bytes,
            )
        )
        return True

    async def stop(self, message: messages.Stop, *, blamed: bool) -> None:
        """The leader's `stop` of a generation at a fault; `blamed`: the fault is this host's."""
        generation, kind = message.generation, message.kind
        if generation == self._acked:  # asked again, by a leader taking over: the same answer
            await self._context.report(self._tiers.stopped(generation))
            return
        if blamed:
            self.faults[kind] = self.faults.get(kind, 0) + 1
            self._context.metrics.faults.labels(kind=kind).inc()
        if generation < self.number:
            return
        self.number = generation  # newer: its start never came (the leader was lost in between)
        self.stopping = True
        self._sdk.stopped(generation)
        self._tiers.pause()
        self._context.log({"source": "leader", "type": "stop", "generation": generation, "kind": kind})
        await self._workloads.stop()  # the whole group, even when the main process is already gone
        self._context.accountant.interrupt(time.time())
        self.restarts[kind] = self.restarts.get(kind, 0) + 1
        self._context.metrics.restarts.labels(kind=kind).inc()
        self._acked = generation
        await self._context.report(self._tiers.stopped(generation))

    def park(self, message: messages.Park) -> None:
        """This host's slice was dropped (scale-down): idle, its steps past the restore point dropped."""
        generation, restore_step = message.generation, message.restore_step
        self.number = generation  # an older workload's late words no longer count
        self._context.metrics.generation.set(generation)
        self.stopping = True
        self._sdk.stopped(generation)
        self.parked = True
        self._workloads.drop_standby()
        self._tiers.start_generation(generation, {}, [])
        self._tiers.discard_after(restore_step)
        self._context.accountant.switch(Category.SCALED_DOWN, time.time())
        self._context.log(
            {"source": "leader", "type": "park", "generation": generation, "restore_step": restore_step}
        )
        self._context.say("parked: slice dropped by a scale-down")
