"""Losses announced ahead of time: save the step in flight everywhere, then hand the host over.

A host whose machine will go says so (messages.Notice: maintenance ahead, a preemption's grace).
While the job trains, the leader picks a step every host is about to reach (the furthest step any
host completed, plus the steps the hosts train in `REACH_SECONDS` at the pace they go) and asks every
host to save it and hold (messages.SaveAt): no host trains a step beyond it that the restart would
only train again. Once every host of the world committed that step, and the noticed host's shard of
it reached its peers (messages.Replicated), the policy decides on the announced loss
(policy.AnnouncedLoss; by default a spare takes the host over now: leader.capacity), and the restart
that follows restores that step. A save not done `MARGIN` before the machine goes is given up: the
policy decides with no step saved, and the restart restores the newest earlier checkpoint (the
unannounced path, said in the job's events and in the event's `saved_step`). A job held after its
save that the policy leaves running (Ignore, Wait) is restarted in place from the saved step: a held
workload trains no further.

Several notices at once (GKE interrupts a whole TPU slice for a host event on one of its VMs, and the
operator's notice reaches every host of that slice) share one save: a notice that comes while a save
is under way asks only its own host for the same step, waits for its own shard to reach its peers,
and gets a decision of its own.
"""

from __future__ import annotations

import asyncio
import math
import time

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader.background import Task
from slicekeeper.supervisor.leader.context import LeaderContext
from slicekeeper.supervisor.leader.generations import Generations
from slicekeeper.supervisor.leader.members import HostStatus
from slicekeeper.supervisor.leader.remediation import Remediation

from slicekeeper import policy
from slicekeeper.policy.events import FaultKind

REACH_SECONDS = 1.0
"""The saved step is this far ahead of the furthest step completed, at the hosts' pace: the time the
request takes to reach every host's workload."""
FEWEST_STEPS_AHEAD = 2
MOST_STEPS_AHEAD = 1000
MARGIN = 0.25
"""The share of the notice (at most MARGIN_SECONDS) kept back for the hand-over after the save."""
MARGIN_SECONDS = 2.0
POLL_SECONDS = 0.05
"""How often the hosts' commits are looked at while the save is awaited (only those not in yet)."""


def steps_ahead(paces: list[float]) -> int:
    """How many steps ahead of the furthest completed one to save, for hosts taking `paces` seconds a
    step (none known: the fewest)."""
    pace = min(paces, default=0.0)
    if pace <= 0:
        return FEWEST_STEPS_AHEAD
    return max(FEWEST_STEPS_AHEAD, min(MOST_STEPS_AHEAD, math.ceil(REACH_SECONDS / pace) + 1))


def pace_of(status: HostStatus) -> float | None:
    """Seconds per step, from the host's recent progress reports."""
    seen = status.steps_seen
    if len(seen) < 2 or seen[-1][1] <= seen[0][1]:
        return None
    return (seen[-1][0] - seen[0][0]) / (seen[-1][1] - seen[0][1])


class AnnouncedLosses:
    def __init__(self, context: LeaderContext, *, generations: Generations, remediation: Remediation) -> None:
        self.context = context
        self.generations = generations
        self.remediation = remediation
        self._noticed: set[int] = set()
        """Hosts whose notice is being acted on (a notice said twice is acted on once)."""
        self._replicated: set[tuple[int, int]] = set()
        """(host, step): the noticed host's shard of the step saved on notice reached its peers."""
        self._asked: tuple[int, int] | None = None
        """(generation, step) of the save asked for on a notice, shared by the notices that follow."""
        self._asked_for: set[int] = set()
        """The noticed hosts of that save: it is done once each one's shard reached its peers."""
        self._saved: set[tuple[int, int, int]] = set()
        """(generation, step, noticed host) of saves seen done: a notice sharing a save whose decision
        another notice's wait made first (and so stopped the job) still counts its step as saved."""

    async def notice(self, report: messages.Notice) -> None:
        host, left = report.host, report.at - time.time()
        await self.context.members.event(
            f"{report.cause} announced for host {host} ({report.source or 'no source given'}): "
            f"its machine goes in {left:.1f} s",
            host=host,
        )
        if host in self._noticed or self.generations.over:
            return
        self._noticed.add(host)
        self.context.background.spawn(Task.NOTICE, self._act_on(report))

    def replicated(self, report: messages.Replicated) -> None:
        self._replicated.add((report.host, report.step))

    async def _act_on(self, report: messages.Notice) -> None:
        try:
            saved = None
            memory = self.context.memory
            if memory.restart.runs(memory.generation) and self.context.world.takes_part(report.host):
                saved = await self._save(report)
            now = time.time()
            event = policy.AnnouncedLoss(
                t=now,
                step=self.context.memory.high_water,
                generation=self.context.memory.generation,
                host=report.host,
                cause=report.cause,
                seconds_left=max(0.0, report.at - now),
                saved_step=saved,
                source=report.source,
            )
            generation = self.context.memory.generation
            await self.remediation.decide_and_act(event)
            if saved is not None and self.context.memory.restart.runs(generation):
                # The policy left the job running, but every workload holds after the saved step.
                detail = f"held after saving step {saved} on notice"
                await self.generations.send(
                    self.generations.fault_stop(report.host, FaultKind.ANNOUNCED_LOSS, detail, now)
                )
                await self.generations.send(self.generations.reconsider())
        finally:
            self._noticed.discard(report.host)

    async def _save(self, report: messages.Notice) -> int | None:
        """Ask every host to save the same step and hold; that step once it is saved everywhere (the
        noticed host's shard replicated too), None when that is not done in time."""
        hosts = list(self.context.world.hosts)
        generation = self.context.memory.generation
        left = report.at - time.time()
        until = report.at - min(MARGIN_SECONDS, MARGIN * max(0.0, left))
        if self._asked is not None and self._asked[0] == generation:
            step = self._asked[1]  # a save under way for an earlier notice: the same step, this host told
            self._asked_for.add(report.host)
            order = messages.SaveAt(generation=generation, step=step, noticed=report.host, until=report.at)
            await self.context.members.send(report.host, order)
        else:
            paces = [
                p
                for p in (pace_of(self.context.status[h]) for h in hosts if h in self.context.status)
                if p is not None
            ]
            step = self.context.memory.high_water + steps_ahead(paces)
            self._asked, self._asked_for = (generation, step), {report.host}
            await self.context.members.broadcast(
                messages.SaveAt(generation=generation, step=step, noticed=report.host, until=report.at)
            )
            await self.context.members.event(
                f"saving step {step} on every host, then holding (a notice of host {report.host})"
            )
        pending = set(hosts)
        while time.time() < until:
            if (generation, step, report.host) in self._saved:
                return step  # seen done by another notice's wait, which may have stopped the job since
            if not self.context.memory.restart.runs(generation):
                break  # stopped meanwhile (a fault): the restart restores what there is
            pending = {h for h in pending if step not in self.context.status[h].committed}
            if not pending and all((h, step) in self._replicated for h in self._asked_for):
                self._saved.update((generation, step, h) for h in self._asked_for)
                noticed = ", ".join(str(h) for h in sorted(self._asked_for))
                await self.context.members.event(
                    f"step {step} saved on every host and replicated for host {noticed}"
                )
                return step
            await asyncio.sleep(POLL_SECONDS)
        await self.context.members.event(
            f"step {step} was not saved on every host before the notice ran out: the restart restores the "
            "newest earlier checkpoint (the unannounced path)"
        )
        return None
