"""Fault -> policy event -> decision -> action: the one place the leader acts on what went wrong.

A fault report stops the job (leader.generations) and asks the policy (leader.decisions) what to do;
a lost host, a straggler and capacity coming back are events too. The decision is written down
(the journal) before anything is done about it, and applied while the members stop: restart in job
(the stop under way is the restart), replace a host (leader.capacity), scale down by whole slices or
back up, wait and decide again, ignore, fail. Decisions are taken one at a time, each on the world
the previous one left, and the next start waits until every pending one is in.

What a decision comes to is data (leader.remedies: the steps, pure); each step has one applier here,
looked up by its type. A decision that raises fails the job with the reason (the leader's background
work counts it), never leaving it stopped with nothing to start it again.

A hang is put down to the host that stopped, not to the first host whose timer fired: the leader
asks every member where its workload is and names the one furthest behind (supervisor.signals.culprit).
A host whose workload is stopped or gone, or whose supervisor does not answer, is restarted for at
once. Otherwise it asks again one allowance later and restarts the job only if the host named for
being behind did not move meanwhile, or, when no host stood out, no host moved: a host only starved
of CPU, or a job only slower than its hang allowance, is not restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader import remedies
from slicekeeper.supervisor.leader.background import Task
from slicekeeper.supervisor.leader.context import LeaderContext
from slicekeeper.supervisor.leader.decisions import Decisions
from slicekeeper.supervisor.leader.generations import Generations, Happening
from slicekeeper.supervisor.leader.restart_events import (
    AllRegistered,
    CapacityOffered,
    Carry,
    Decided,
    DecideOnLoss,
    Hold,
    HostLost,
    JobFails,
    NoteLoss,
    NoWorkload,
    OfferCapacity,
    Release,
    Request,
    StandIn,
)
from slicekeeper.supervisor.leader.restart_state import DECIDING, WAITING, JobState
from slicekeeper.supervisor.signals.culprit import GONE, Activity, Evidence, moved, name_culprit

from slicekeeper import policy
from slicekeeper.chaos import ChaosKind
from slicekeeper.policy.events import FaultKind

ACTIVITY_REPLY_SECONDS = 2.0
"""At a hang report, how long every member gets to say where its workload is (supervisor.signals.culprit);
one that does not answer in time is taken for the host that stopped."""

HANG_CONFIRM_MAX_SECONDS = 30.0
"""When no host is halted at a hang report, every member is asked again one allowance later (the
reporter's silence, at least ACTIVITY_REPLY_SECONDS, at most this many seconds) and the job restarts
only if the host furthest behind (or, with none behind, every host) did not move in between: a host
starved of CPU, or a job only slower than its allowance, has moved on by then."""


class Remediation:
    def __init__(self, context: LeaderContext, *, generations: Generations) -> None:
        self.context = context
        self.generations = generations
        self._turn = asyncio.Lock()
        self.capacity_offer = False
        """Capacity came back while the job runs scaled down: offer it to the policy once it trains."""
        self._activities: dict[int, Activity] | None = None
        """While a hang's culprit is being named: the members' answers so far (else None)."""
        self._activities_in = asyncio.Event()
        self._unanswered: set[int] = set()
        """Hosts asked where they are that have not answered (nor been lost) yet."""
        self._appliers: dict[type, Callable[[policy.Event, Any], Awaitable[bool]]] = {
            remedies.StopFirst: self._stop_first,
            remedies.HoldFor: self._hold,
            policy.Fail: self._fail,
            policy.ReplaceHost: self._replace,
            policy.ScaleDown: self._scale_down,
            policy.ScaleUp: self._scale_up,
        }
        """One applier per step a decision comes to (leader.remedies), by the step's type."""

    # --- faults -------------------------------------------------------------------------------
    async def fault(self, report: messages.Fault) -> None:
        if not self.context.memory.restart.runs(report.generation):
            return  # already being handled: one restart per generation
        if report.invalid_step is not None:
            # The restored state proved bad (e.g. a non-finite loss right after a restore): no host
            # may restore that step again, from any tier.
            self.context.memory.job_invalid.add(report.invalid_step)
        if report.kind is FaultKind.HANG:
            if self._activities is None:  # else: the same stall, noticed again while being named
                # Not awaited here: the answers come over the members' connections, the reporter's
                # included, whose reading must go on.
                self._activities = {}
                self.context.background.spawn(Task.HANG_CULPRIT, self._hang(report))
            return
        await self._fault_of(report.host, report)

    async def _fault_of(self, host: int, report: messages.Fault) -> None:
        """Stop the job for a fault of `host`, then decide what to do about it."""
        event = Decisions.fault_event(
            host, report, self.context.memory.high_water, self.context.memory.generation
        )
        if await self._stopped(self.generations.fault_stop(host, report.kind, report.detail, report.t)):
            await self.decide_and_act(event)

    async def _hang(self, report: messages.Fault) -> None:
        generation = self.context.memory.generation
        named = await self._hang_culprit(report)
        if named is not None and self._running(generation):  # not stopped meanwhile
            await self._fault_of(*named)

    def _running(self, generation: int) -> bool:
        return self.context.memory.restart.runs(generation)

    async def _hang_culprit(self, report: messages.Fault) -> tuple[int, messages.Fault] | None:
        """Ask every member where its workload is and name the host that stopped (supervisor.signals.culprit);
        returns it with the report's detail saying who noticed and why that host. Unless the culprit
        is halted (its process stopped or gone, its supervisor silent), ask again one allowance later:
        None when the host named for being behind moved meanwhile, or, with no host standing out, when
        any host did (the job was only slow)."""
        generation = self.context.memory.generation
        try:
            asked_at = time.monotonic()
            answers = await self._where_they_are()
            culprit = name_culprit(answers, report.host)
            latest = answers
            confirmed = ""
            if culprit.evidence is not Evidence.HALTED and answers:
                wait = max(ACTIVITY_REPLY_SECONDS, report.silent_seconds or 0.0)
                await asyncio.sleep(min(wait, HANG_CONFIRM_MAX_SECONDS))
                if not self._running(generation):
                    return None
                elapsed = time.monotonic() - asked_at
                again = await self._where_they_are()
                behind = culprit.evidence is Evidence.BEHIND  # else: no host stands out, watch them all
                watched = {culprit.host: answers[culprit.host]} if behind else answers
                if went_on := moved(watched, again, elapsed):
                    hosts = ", ".join(str(h) for h in went_on)
                    await self.context.members.event(
                        f"hang reported by host {report.host} not confirmed: host(s) {hosts} went on "
                        f"within {elapsed:.1f} s ({report.detail}; {culprit.reason}); no restart",
                        host=report.host,
                    )
                    return None
                still = f"host {culprit.host} did not move" if behind else "no host went on"
                culprit = name_culprit(again, report.host)
                latest = again
                confirmed = f"; {still} in {elapsed:.1f} s"
        finally:
            self._activities = None
        noticed = f"noticed by host {report.host}" if culprit.host != report.host else "noticed by itself"
        update: dict[str, Any] = {"detail": f"{report.detail} ({noticed}; {culprit.reason}{confirmed})"}
        named = latest.get(culprit.host)
        if named is not None and named.process == GONE:
            # Its workload died and its supervisor has not reaped it yet (a zombie: a supervisor held
            # up for seconds, as on a loaded machine): a crash, which the hang timers saw first.
            update["kind"] = FaultKind.CRASH
        return culprit.host, report.model_copy(update=update)

    async def _where_they_are(self) -> dict[int, Activity | None]:
        """Every member's answer to where its workload is (None: no answer within the reply time)."""
        self._activities, self._activities_in = {}, asyncio.Event()
        asked = [h for h in self.context.world.hosts if h in self.context.members]
        self._unanswered = set(asked)
        for member in asked:
            await self.context.members.send(
                member, messages.ActivityRequest(generation=self.context.memory.generation)
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._activities_in.wait(), ACTIVITY_REPLY_SECONDS)
        return {h: self._activities.get(h) for h in asked}

    def activity(self, report: messages.ActivityReport) -> None:
        """A member's answer to the question where its workload is."""
        if self._activities is None or report.generation != self.context.memory.generation:
            return
        self._activities[report.host] = Activity.from_message(report.model_dump())
        self._answered(report.host)

    def _answered(self, host: int) -> None:
        """`host` answered where it is, or was lost meanwhile: the question is over once none is left
        (kept as a set of those left: a check of every host at each answer costs the square of them)."""
        self._unanswered.discard(host)
        if not self._unanswered:
            self._activities_in.set()

    async def host_lost(self, host: int, machine: str) -> None:
        """A member's connection dropped: its machine is gone, with its local tier and replicas."""
        detail = f"lost contact with the supervisor of host {host} ({machine or 'unknown machine'})"
        self._answered(host)  # no answer comes from it
        if not self.context.world.takes_part(host):
            # An idle host of a dropped slice: nothing stops; a scale-up will need a spare for it.
            await self.context.members.event(f"idle host {host} of a dropped slice lost: {detail}", host=host)
            return
        now = time.time()

        def lost() -> HostLost:  # with the members live and the hosts taking part when its turn comes
            live, world = frozenset(self.context.members.live()), tuple(self.context.world.hosts)
            return HostLost(host, detail, now, live, world)

        for request in await self.generations.ask(lost):
            match request:
                case NoteLoss():
                    await self.context.members.event(
                        f"host_lost detected on host {host}: {detail}", host=host, kind=FaultKind.HOST_LOST
                    )
                case StandIn():  # before the first start nothing trained yet: a new machine, or no start
                    refused = await self.context.capacity.stand_in(host)
                    if refused is not None:
                        await self.generations.send(JobFails(refused))
                    elif len(self.context.members.live()) == self.context.world.full_hosts:
                        await self.generations.send(AllRegistered())
                case DecideOnLoss():
                    event = policy.HostLost(
                        t=time.time(),
                        step=self.context.memory.high_water,
                        generation=self.context.memory.generation,
                        host=host,
                        machine=machine,
                    )
                    await self.decide_and_act(event)

    async def supervisor_restarted(self, host: int, machine: str) -> None:
        """`host`'s supervisor was started again on its machine (its workload died with the one
        before): a crash of that host, stopped and decided on like any other (SIGKILL, as a container
        runtime ends a process it restarts)."""
        now = time.time()
        detail = f"the supervisor of {machine} restarted; its workload died with the one before"
        event = policy.Crash(
            t=now,
            step=self.context.memory.high_water,
            generation=self.context.memory.generation,
            host=host,
            signal="SIGKILL",
            detail=detail,
        )
        if await self._stopped(self.generations.fault_stop(host, FaultKind.CRASH, detail, now)):
            await self.decide_and_act(event)

    async def no_replacement(self, host: int) -> None:
        """In a cluster, no new pod joined for `host` in time: the policy decides again, with no spare."""
        event = policy.HostLost(
            t=time.time(),
            step=self.context.memory.high_water,
            generation=self.context.memory.generation,
            host=host,
            machine="none",
        )
        await self.decide_and_act(event)

    # --- signals while training ---------------------------------------------------------------
    async def straggler_check(
        self, host: int, step: int, work: float | None, now: float, *, core: int | None = None
    ) -> None:
        """A host's own work in a step (`now`: when it ended; `core`: the core it ran on, in local
        mode): find stragglers and decide on them."""
        for finding in self.context.decisions.observe(host, step, work, core=core):
            await self.context.members.event(
                f"straggler: host {finding.host} score {finding.score:.2f} at step {finding.step}",
                host=finding.host,
            )
            for (
                record
            ) in self.context.memory.faults:  # a `slow` fault is detected when its host is found straggling
                if (
                    record.kind is ChaosKind.SLOW
                    and record.host == finding.host
                    and record.detected_at is None
                ):
                    record.detected_at, record.detected_as = now, FaultKind.STRAGGLER
            event = policy.Straggler(
                t=now,
                step=self.context.memory.high_water,
                generation=self.context.memory.generation,
                host=finding.host,
                score=finding.score,
            )
            self.context.background.spawn(Task.DECISION, self.decide_and_act(event))
        if self.capacity_offer:
            await self.offer_capacity()

    async def capacity_returned(self) -> None:
        """A machine joined while the job may run scaled down: offered to the policy now, or once
        the job trains again."""
        self.capacity_offer = True
        await self.offer_capacity()

    async def offer_capacity(self) -> None:
        """Machines joined while the job runs scaled down: the policy may scale back up."""
        if OfferCapacity() not in await self.generations.ask(CapacityOffered()):
            return  # offered once the job trains again
        self.capacity_offer = False
        event = policy.CapacityReturned(
            t=time.time(),
            step=self.context.memory.high_water,
            generation=self.context.memory.generation,
            spares=self.context.capacity.for_scale_up(),
        )
        await self.decide_and_act(event)

    # --- decide, then act ---------------------------------------------------------------------
    def _idle_hosts(self) -> set[int]:
        world = set(self.context.world.hosts)  # once: a tuple made per host would cost the square of the size
        return {h for h in self.context.members.live() if h not in world}

    async def decide_and_act(self, event: policy.Event) -> None:
        await self.generations.send(
            Hold(DECIDING)
        )  # queued too: no start before every pending decision is in
        try:
            async with self._turn:  # one at a time: each on the world the previous one left
                if self.generations.over:
                    return
                decision = await asyncio.to_thread(
                    self.context.decisions.decide,
                    event,
                    spares=self.context.capacity.for_policy(),
                    idle=self._idle_hosts(),
                    step=self.context.memory.high_water,
                    generation=self.context.memory.generation,
                )
                action = decision.action
                reason = f" ({decision.reason})" if decision.reason else ""
                await self.context.members.event(
                    f"decision ({decision.source.value}): {action.name} for {event.summary}{reason}"
                )
                await self.context.journal.write()  # the decision, before anything is done about it
                for step in _intents(await self.generations.ask(Decided(event, action))):
                    if self.generations.over:
                        break
                    if not await self._appliers[type(step)](event, step):
                        break
        except Exception as error:  # a decision that cannot be taken or applied: the job fails with it
            await self.context.background.failed(Task.DECISION, error, f"deciding on {event.summary}")
        finally:
            await self.generations.send(Release(DECIDING))
        await self.generations.send(self.generations.reconsider())

    async def _stopped(self, fault: Happening) -> bool:
        """Send a fault to the restart machine: True when the job stops for it (False: it failed, or
        was not running)."""
        return (await self.generations.send(fault)).phase is JobState.STOPPING

    # --- the appliers: each returns whether the next step may follow --------------------------
    async def _fail(self, event: policy.Event, action: policy.Fail) -> bool:
        await self.generations.send(JobFails(action.reason))
        return False

    async def _hold(self, event: policy.Event, hold: remedies.HoldFor) -> bool:
        if hold.holds:
            await self.generations.send(Hold(WAITING))  # the job stays stopped until reconsidered
        self.context.background.later(hold.seconds, Task.WAIT, lambda: self._reconsider(event, hold.holds))
        return True

    async def _stop_first(self, event: policy.Event, stop: remedies.StopFirst) -> bool:
        fault = self.generations.fault_stop(stop.host, stop.kind, stop.detail, time.time(), stop.planned)
        return await self._stopped(fault)

    async def _reconsider(self, event: policy.Event, held: bool) -> None:
        """A `Wait` is over: offer the same event again, with the facts of now."""
        if held:
            await self.generations.send(Release(WAITING))
        if isinstance(event, policy.CapacityReturned) and not self.context.world.scaled_down:
            await self.generations.send(self.generations.reconsider())
            return
        fresh = dataclasses.replace(
            event,
            t=time.time(),
            step=self.context.memory.high_water,
            generation=self.context.memory.generation,
        )
        await self.decide_and_act(fresh)

    async def _replace(self, event: policy.Event, action: policy.ReplaceHost) -> bool:
        refused = await self.context.capacity.replace(action.host, f"replaced ({event.kind})")
        if refused is not None:
            await self.generations.send(JobFails(refused))
            return False
        return True

    async def _scale_down(self, event: policy.Event, action: policy.ScaleDown) -> bool:
        before = list(self.context.world.active)
        host = getattr(event, "host", None)
        slices = list(action.slices) or ([self.context.world.slice_of(host)] if host is not None else [])
        slices = [s for s in slices if s in self.context.world.active]
        if not slices:
            return True
        try:
            self.context.world.drop(slices)
        except ValueError as error:
            await self.generations.send(JobFails(str(error)))
            return False
        self.context.checkpoints.joined -= {h for s in slices for h in self.context.world.hosts_of(s)}
        self.context.decisions.scaled(
            "down", before, self.context.memory.high_water, self.context.memory.generation, str(event.kind)
        )
        await self.context.members.event(
            f"scale-down: slice(s) {slices} dropped, {len(self.context.world.hosts)} hosts go on"
        )
        return True

    async def _scale_up(self, event: policy.Event, action: policy.ScaleUp) -> bool:
        before = list(self.context.world.active)
        back = self.context.world.restorable(self._idle_hosts(), self.context.capacity.for_scale_up())
        if back:
            # The world first: a spare's assignment writes the journal down, and a leader taking over
            # from it must find the slices back, not a spare serving a host of a dropped slice.
            self.context.world.restore(back)
            self.context.decisions.scaled(
                "up", before, self.context.memory.high_water, self.context.memory.generation, str(event.kind)
            )
        for slice_index in back:
            for host in self.context.world.hosts_of(slice_index):
                if host not in self.context.members:
                    await self.context.capacity.stand_in(host, scale_up=True)
                await self.generations.send(NoWorkload(host))  # idle or new: no workload to stop
                self.context.checkpoints.joined.add(host)
        if back:
            await self.context.members.event(
                f"scale-up: slice(s) {back} back, {len(self.context.world.hosts)} hosts"
            )
        return True


def _intents(requests: tuple[Request, ...]) -> list[remedies.Intent]:
    """The steps that carry out a decision, as the machine answered it (none once the job ended)."""
    return [intent for request in requests if isinstance(request, Carry) for intent in request.intents]
