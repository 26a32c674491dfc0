"""What a host's supervisor does for the job while it leads: the `Leader` it runs for a term, and the
job's status it publishes.

`supervisor.host.leadership` decides when this supervisor leads; this module says with what. The
leader of a term is built from the job's plan (restart limits, policy engine, persistent tier, the
site's coordinator addresses and replacement timeout) so that every candidate builds the same one;
while it leads, the job's status is published to watchers and, in a pod, on the pod itself (with
this host's goodput), where the operator reads it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTier
from slicekeeper.supervisor.host.site import PodAnnotations, Site
from slicekeeper.supervisor.leader import Leader
from slicekeeper.supervisor.plan import JobPlan

from slicekeeper.leader_view import LeaderView
from slicekeeper.policy.engine import PolicyEngine

LAST_BROADCAST_SECONDS = 0.2
"""At the job's end, how long the leader lets its last broadcast reach members and watchers."""


class LeaderDuties:
    def __init__(
        self,
        plan: JobPlan,
        site: Site,
        *,
        persistent: PersistentTier | None,
        pod: PodAnnotations | None,
        goodput: Callable[[], float],
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
    ) -> None:
        self._plan = plan
        self._site = site
        self._persistent = persistent
        self._pod = pod
        self._goodput = goodput
        """This host's goodput so far, published with the job's status."""
        self._spawn = spawn
        self._tasks: list[asyncio.Task[None]] = []

    def new_leader(self, term: int, leading: Callable[[], bool]) -> Leader:
        """The job's leader for `term`, run by this supervisor while it holds the lease."""
        plan = self._plan
        spec = plan.training_job.spec
        return Leader(
            plan.shape.host_count,
            spec.health.max_restarts,
            lambda generation, rank0: self._site.coordinator_address(plan.layout, rank0),
            Path(plan.run_dir) / "job-summary.json",
            spec.health.max_restarts_without_progress,
            persistent=self._persistent,
            persistent_keep=spec.checkpoint.persistent.max_to_keep if spec.checkpoint.persistent else 2,
            hosts_per_slice=plan.shape.hosts_per_slice,
            min_slices=spec.min_slices,
            devices_per_host=plan.shape.devices_per_host,
            engine=PolicyEngine.from_spec(spec.policy),
            events_path=Path(plan.run_dir) / "policy-events.jsonl",
            replacements=self._site.replacements,
            log_events=self._site.log_events,
            term=term,
            leading=leading,
        )

    def begin(self, leader: Leader) -> None:
        """This supervisor leads now: it publishes the job's status (to watchers, on its pod)."""
        self.end()
        self._tasks = [self._spawn(leader.publish_status())]
        if self._pod is not None:
            published = self._pod.keep_status_published(lambda: dict(self.status(leader)), leader.leading)
            self._tasks.append(self._spawn(published))

    def end(self) -> None:
        """It leads no more: its publishing stops."""
        for task in self._tasks:
            task.cancel()
        self._tasks = []

    async def publish_last(self, leader: Leader, sure: Callable[[], Awaitable[bool]]) -> None:
        """The job ended under this leader: its final status reaches members, watchers and, once
        `sure` confirms it still leads, the pod."""
        await asyncio.sleep(LAST_BROADCAST_SECONDS)
        if self._pod is not None and await sure():
            await self._pod.publish_status(dict(self.status(leader)))

    def status(self, leader: Leader) -> LeaderView:
        """The job's status as the operator reads it from the leader's pod."""
        view = leader.cluster_status()
        view["goodput"] = round(self._goodput(), 4)
        return view
