"""Fault injection for local runs: the chaos faults aimed at this host, fired at their steps.

`slicekeeper run --chaos kill:host=1@step=30,...` (slicekeeper/chaos.py parses the specs) has every
supervisor fire the faults aimed at its own host when its workload begins the named step, each
exactly once: kill (SIGKILL), hang (SIGSTOP), slow (the SDK slows this machine's own work),
corrupt (bytes flipped in the newest local checkpoint), lose (the whole machine gone, processes
and disk), crash-supervisor (this supervisor process gone, its machine intact: the local runtime
starts it again) and partition (its packets dropped both ways, its connections left open:
supervisor.host.partition). A spare taking over a host takes over that host's faults not fired yet. Each fault
is noted in the machine's record before it is inflicted (supervisor.host.machine_record), so a
supervisor started again on the same machine never fires it twice. Job-wide faults (`spare`) are the
local runtime's.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoints.tiers import CheckpointTiers
from slicekeeper.supervisor.host import notices, partition
from slicekeeper.supervisor.host.context import HostContext
from slicekeeper.supervisor.host.machine_record import MachineRecord
from slicekeeper.supervisor.workload_process import WorkloadProcess

from slicekeeper.chaos import BEGIN, ChaosKind, Fault, parse_chaos

LOST_EXIT_CODE = 137
"""How a supervisor whose machine a `lose` fault took ends (as if SIGKILLed). A `crash-supervisor`
fault SIGKILLs the supervisor for real: the local runtime starts again a supervisor killed by a
signal, never one that exited (supervisor.local.local_runtime)."""


def faults_of(specs: list[str], host: int | None, fired: set[str]) -> list[Fault]:
    """The chaos faults aimed at `host` (not the job-wide ones, e.g. `spare`) not fired yet."""
    return [f for f in parse_chaos(",".join(specs)) if f.aimed_at(host) and str(f) not in fired]


JOURNAL_GRACE_SECONDS = 0.3
"""A lost machine's last moment: long enough for the leader to journal the chaos fault that lost it."""


def hang_holds(faults: list[Fault]) -> str:
    """protocol.ENV_CHAOS_HOLD for `faults` not fired yet: the steps a `hang` stops as they begin."""
    return ",".join(str(f.step) for f in faults if f.kind is ChaosKind.HANG and f.at == BEGIN)


class Chaos:
    """The faults aimed at this host not fired yet, the `slow` factor of this machine, and the means
    to inflict them: the workload's signals, its local checkpoints, the whole machine."""

    def __init__(
        self,
        context: HostContext,
        *,
        record: MachineRecord,
        tiers: CheckpointTiers,
        fired: set[str],
        kill_workload: Callable[[], None],
        write_report: Callable[[str], None],
        leading: Callable[[], bool] = lambda: False,
        relaying: Callable[[], bool] = lambda: False,
    ) -> None:
        """`fired`: this host's faults the job's memory says fired already (on a machine it was taken
        over from); `record`: the machine's own record of the faults it fired; `kill_workload`:
        SIGKILLs the workload and its standby; `write_report(end)`: this host's report, as a "lost"
        machine's or a "crashed" supervisor's; `leading`: whether this supervisor leads the job now;
        `relaying`: whether it relays its group's members to the leader (supervisor.host.relay)."""
        self._context = context
        self._record = record
        self._tiers = tiers
        self._kill_workload = kill_workload
        self._write_report = write_report
        self._leading = leading
        self._relaying = relaying
        self.faults = faults_of(context.plan.chaos, context.host, fired | set(record.fired))
        self.slow: float | None = record.slow
        """Chaos `slow`: this machine's work factor once fired (a machine property: a spare taking
        over is not slow)."""

    def slow_spec(self) -> str:
        """Chaos `slow` for the workload (protocol.ENV_CHAOS_SLOW): `F@S` before it fired, `F@0`
        after (a machine property: every later process of this machine is slow from its start)."""
        if self.slow is not None:
            return f"{self.slow}@0"
        pending = [f for f in self.faults if f.kind is ChaosKind.SLOW]
        return f"{pending[0].factor}@{pending[0].step}" if pending else ""

    def hold_spec(self) -> str:
        """The steps of this host's pending `hang` faults at a step's begin, for the workload
        (protocol.ENV_CHAOS_HOLD): its SDK waits there for the stop."""
        return hang_holds(self.faults)

    def inject(self, step: int, workload: WorkloadProcess | None, generation: int, at: str = BEGIN) -> None:
        """Fire the chaos faults aimed at this host and this step, at this point of it (`at`: as it
        begins, or once its own work is done, inside the collective), each exactly once."""
        for fault in [f for f in self.faults if f.step == step and f.at == at]:
            self.faults.remove(fault)
            self._record.fire(str(fault), slow=fault.factor if fault.kind is ChaosKind.SLOW else None)
            assert workload is not None
            chaos = messages.ChaosFired(
                kind=fault.kind.value,
                step=step,
                fault=str(fault),
                generation=generation,
                # corrupt and slow stop nothing by themselves: no restart's detection is theirs
                disruptive=fault.kind.disruptive,
            )
            if fault.kind is ChaosKind.KILL:
                workload.signal(signal.SIGKILL)
            elif fault.kind is ChaosKind.HANG:
                workload.signal(signal.SIGSTOP)
            elif fault.kind is ChaosKind.SLOW:
                self.slow = fault.factor  # the SDK applies it (protocol.ENV_CHAOS_SLOW)
            elif fault.kind is ChaosKind.CORRUPT:
                self._context.spawn(self._corrupt(chaos))
                continue
            elif fault.kind is ChaosKind.LOSE:
                self._context.spawn(self._lose_machine(chaos))
                continue
            elif fault.kind is ChaosKind.CRASH_SUPERVISOR:
                self._context.spawn(self._crash_supervisor(chaos))
                continue
            elif fault.kind is ChaosKind.PARTITION:
                self._context.spawn(self._partition(chaos, fault.seconds))
                continue
            elif fault.kind in (ChaosKind.MAINTENANCE, ChaosKind.PREEMPT):
                self._context.spawn(self._announced(chaos, fault))
                continue
            self._context.log(_record(chaos))
            self._context.spawn(self._tell(chaos))

    async def _tell(self, chaos: messages.ChaosFired) -> None:
        await self._context.report(chaos)

    async def _corrupt(self, chaos: messages.ChaosFired) -> None:
        """Chaos `corrupt`: the newest local step's bytes flipped once it is saved (the newest step
        due by the save interval) and its copies are out (`CheckpointTiers.corrupt_newest_at_rest`),
        then logged and reported with the step."""
        interval = self._context.plan.training_job.spec.checkpoint.interval
        due = (chaos.step - 1) // interval * interval  # saved before the step the fault fired at
        corrupted = await self._tiers.corrupt_newest_at_rest(due or None)
        detail = (
            f"flipped bytes in local step {corrupted}, noticed at the next restore"
            if corrupted is not None
            else "no committed local step to corrupt yet"
        )
        chaos = chaos.model_copy(update={"detail": detail})
        self._context.log(_record(chaos))
        await self._context.report(chaos)

    async def _said(self, chaos: messages.ChaosFired) -> None:
        """The fault logged and reported before this supervisor goes."""
        self._context.log(_record(chaos))
        await self._context.report(chaos)
        if self._leading() or self._relaying():
            # A simulation's courtesy: the leader in this very process journals the fault on the
            # members before it goes, so that the job's memory has it whoever leads next (the
            # workload lives on meanwhile: killed now, its exit would be reported as a crash); the
            # relay in this very process carries the report on to the leader (this host's own
            # report goes through it too), or a spare taking the host over fires the fault again.
            await asyncio.sleep(JOURNAL_GRACE_SECONDS)

    async def _partition(self, chaos: messages.ChaosFired, seconds: float | None) -> None:
        """Chaos `partition`: this machine's packets dropped, both ways, for `seconds` (None: for
        good), its connections left open (supervisor.host.partition). A machine cut off for good
        that gives up looking for a leader ends as one a cluster would replace, not as a failed job."""
        await self._said(chaos)
        table = partition.table_name(self._context.plan.run_key, self._context.machine)
        try:
            sockets = await asyncio.to_thread(partition.cut, table, os.getgid(), os.getpid())
        except (RuntimeError, OSError) as error:
            self._context.say(f"chaos {chaos.fault}: could not cut this machine off: {error}")
            return
        self._context.site.cut_off = True
        self._context.say(
            f"chaos {chaos.fault}: cut off ({len(sockets.connections)} connection(s), "
            f"{len(sockets.ports)} port(s) silenced)" + (f" for {seconds:g} s" if seconds else " for good")
        )
        if seconds is None:
            return
        await asyncio.sleep(seconds)
        await asyncio.to_thread(partition.heal, table)
        self._context.site.cut_off = False
        self._context.say(f"chaos {chaos.fault}: the partition healed")

    async def _announced(self, chaos: messages.ChaosFired, fault: Fault) -> None:
        """Chaos `maintenance` / `preempt`: the loss of this machine announced `fault.warning` seconds
        ahead (a maintenance notice, a preemption's SIGTERM and grace), then the machine goes as with
        `lose`, unless its host was handed to another machine meanwhile (the supervisor retired)."""
        self._context.log(_record(chaos))
        await self._context.report(chaos)
        maintenance = fault.kind is ChaosKind.MAINTENANCE
        await notices.announce(
            self._context,
            "maintenance" if maintenance else "preemption",
            fault.warning,
            f"chaos {fault}" if maintenance else f"SIGTERM with a {fault.warning:g} s grace (chaos {fault})",
        )
        await asyncio.sleep(fault.warning)
        self._machine_goes(chaos)

    async def _crash_supervisor(self, chaos: messages.ChaosFired) -> NoReturn:
        """Chaos `crash-supervisor`: this process dies at once; its workload dies with it (they are
        bound to it, supervisor.workload_process), its disk stays."""
        await self._said(chaos)
        self._context.accountant.interrupt(time.time())
        self._write_report("crashed")  # a simulation's courtesy: the time it accounted still counts
        print(
            f"[{self._context.machine}] supervisor crashed (chaos {chaos.fault})", file=sys.stderr, flush=True
        )
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable: SIGKILL cannot be caught")

    async def _lose_machine(self, chaos: messages.ChaosFired) -> NoReturn:
        """Chaos `lose`: this machine is gone for good, processes and disk; the leader sees it vanish."""
        await self._said(chaos)
        self._machine_goes(chaos)

    def _machine_goes(self, chaos: messages.ChaosFired) -> NoReturn:
        self._kill_workload()
        self._tiers.wipe()
        self._context.accountant.interrupt(time.time())
        self._write_report("lost")  # a simulation's courtesy: the time this host trained still counts
        print(f"[{self._context.machine}] lost (chaos {chaos.fault})", file=sys.stderr, flush=True)
        os._exit(LOST_EXIT_CODE)


def _record(chaos: messages.ChaosFired) -> dict[str, Any]:
    """The fault fired, for this host's event log."""
    return {"source": "chaos", **chaos.model_dump(mode="json", exclude={"host", "t"})}
