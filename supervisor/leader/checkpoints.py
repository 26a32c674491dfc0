"""What the job's checkpoints are, across hosts and tiers, as the leader keeps track of them.

Each host reports what its local tier committed, which copies failed, which shards it keeps for its
peers (at every stop, read from disk) and which it uploaded to the persistent tier; the leader commits
a persistent step once every active host's shard of it is there. From all of that, at every start,
the restore plan (supervisor.checkpoints.restore_plan) picks the newest step every host can restore and where
each host reads its shard from. Steps newer than the restore belong to an abandoned timeline and are
dropped from every record.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoint_vocabulary import Tier
from slicekeeper.supervisor.checkpoints import store_calls
from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTier, PersistentTierError
from slicekeeper.supervisor.checkpoints.restore_plan import Holdings, RestorePlan, plan_restore
from slicekeeper.supervisor.leader import restart_records
from slicekeeper.supervisor.leader.journal import JobMemory
from slicekeeper.supervisor.leader.members import HostStatus, Members
from slicekeeper.supervisor.leader.world import JobWorld

T = TypeVar("T")


def invalid_reason(report: messages.CheckpointInvalid) -> str:
    """Why a copy is invalid, in words: its reason and what the host found, as far as it said."""
    return ": ".join(part for part in (report.reason, report.detail) if part) or "no reason given"


class Checkpoints:
    def __init__(
        self,
        memory: JobMemory,
        status: dict[int, HostStatus],
        world: JobWorld,
        members: Members,
        persistent: PersistentTier | None,
        keep: int,
        write_journal: Callable[[], Awaitable[None]],
    ) -> None:
        self.memory = memory
        self.status = status
        self.world = world
        self.members = members
        self.persistent = persistent
        self.keep = keep
        self._write_journal = write_journal
        self._staged: dict[tuple[int, int], dict[str, Any]] = {}
        """(host, generation) -> its restore record, until its workload says what it loaded (found
        without a look at every record: a restart of 25,000 hosts records 25,000)."""
        self.joined: set[int] = set()
        """Hosts entering the world at the next start (their slice comes back): they may use twins."""

    # --- what the hosts report ----------------------------------------------------------------
    async def invalid(self, report: messages.CheckpointInvalid) -> None:
        host, step, tier = report.host, report.step, report.tier
        status = self.status[host]
        if tier == Tier.LOCAL:
            status.committed.discard(step)
            if report.reason != "corrupt":
                status.invalid.add(step)  # a failed save: no tier will ever hold it
            # a corrupt local copy is quarantined; a peer or the persistent tier may hold a good one
        elif tier == Tier.PERSISTENT:
            self.memory.persisted.get(step, set()).discard(host)
        elif tier == "any":
            status.invalid.add(step)  # every source of this host's shard failed at restore
        # peer: the holder simply lacks that copy, and its inventory at the next stop says so
        if report.reason in ("save failed", "upload failed", "upload skipped", "replication failed"):
            self.memory.failed_saves[tier] += 1
        await self.members.event(
            f"checkpoint of step {step} on host {host} invalid ({tier}): {invalid_reason(report)}", host=host
        )

    def stopped(self, report: messages.Stopped) -> None:
        """What a stopped host's disk holds, read once its workload was dead."""
        status = self.status[report.host]
        if report.committed is not None:
            status.committed = set(report.committed) - status.invalid
        if report.replicas is not None:
            status.replicas = {owner: set(steps) for owner, steps in report.replicas.items()}

    async def persisted(self, host: int, step: int) -> None:
        """Commit a persistent step once every host's shard of it is uploaded, then apply retention."""
        uploaded = self.memory.persisted.setdefault(step, set())
        uploaded.add(host)
        if (
            len(uploaded) < self.world.shape.hosts_per_slice * len(self.world.active)  # cheap, first
            or not set(self.world.hosts) <= uploaded
            or self.persistent is None
            or step in self.memory.persistent_committed
        ):
            return
        try:
            await self._store(f"commit of step {step}", self.persistent.commit, step)
            await self._store("retention", self.persistent.retain, self.keep)
        except (OSError, PersistentTierError) as error:
            self.memory.failed_saves[Tier.PERSISTENT] += 1
            await self.members.event(f"persistent checkpoint of step {step} not committed: {error}")
            return
        self.memory.persistent_committed = set(
            sorted({*self.memory.persistent_committed, step})[-self.keep :]
        )
        self.memory.persistent_owners[step] = set(uploaded)
        self.memory.persistent_commits.append({"step": step, "t": time.time()})
        for old in [s for s in self.memory.persisted if s <= step]:
            del self.memory.persisted[old]
        await self.members.event(f"persistent checkpoint of step {step} committed")
        await self._write_journal()

    def restored(self, report: messages.Restored) -> None:
        """A supervisor staged its host's shard of the agreed step into its local tier."""
        restore = self._staged[report.host, self.memory.generation] = {
            "host": report.host,
            "step": report.step,
            "tier": report.tier,
            "holder": report.holder,
            "generation": self.memory.generation,
            "seconds": report.seconds,
            "bytes": report.bytes,
            "loaded_step": None,
        }
        restart_records.staged(self.memory.restores, restore, len(self.world.hosts))

    def loaded(self, report: messages.Loaded) -> None:
        """A workload says which step it restored: checked against the step its supervisor staged."""
        staged = self._staged.pop((report.host, report.generation), None)
        if restart_records.loaded(self.memory.restores, report.host, report.generation, report.step):
            return  # a large world's restores, summed up
        if staged is None:  # staged under another leader (it took over meanwhile): found the long way
            staged = next(
                (
                    restore
                    for restore in reversed(self.memory.restores)
                    if restore["host"] == report.host and restore["generation"] == report.generation
                ),
                None,
            )
        if staged is not None:
            staged["loaded_step"] = report.step
            return
        # A workload that restored a step nobody staged for it (a loop restoring on its own).
        self.memory.restores.append(
            {
                "host": report.host,
                "step": None,
                "tier": None,
                "holder": None,
                "generation": report.generation,
                "loaded_step": report.step,
            }
        )

    async def _store(self, what: str, function: Callable[..., T], *args: object) -> T:
        """A call to the persistent tier's store, under its deadline and bounded retries."""
        assert self.persistent is not None
        return await store_calls.call(self.persistent, what, function, *args)

    # --- at a start -----------------------------------------------------------------------------
    def holdings(self) -> Holdings:
        return Holdings(
            local={h: set(s.committed) for h, s in self.status.items()},
            replicas={h: {o: set(v) for o, v in s.replicas.items()} for h, s in self.status.items()},
            persistent=set(self.memory.persistent_committed),
            invalid={h: set(s.invalid) for h, s in self.status.items()},
            job_invalid=set(self.memory.job_invalid),
            persistent_owners={s: set(o) for s, o in self.memory.persistent_owners.items()},
        )

    def restore_plan(self) -> RestorePlan:
        twins = {h: [t for t in self.world.twins(h) if t not in self.joined] for h in self.joined}
        return plan_restore(self.world.hosts, self.holdings(), live=self.members.live(), twins=twins)

    async def find_persistent(self) -> str | None:
        """Before the first start: the steps earlier runs of this job committed to the persistent tier
        (a suspended job resumed, a job re-created under the same name, a leader started again).
        Returns why the tier cannot be read (the job fails: starting from scratch would silently throw
        away what it holds), else None."""
        if self.persistent is None:
            return None
        try:
            owners = await self._store("listing", self.persistent.committed_owners)
        except PersistentTierError as error:
            return f"cannot read the persistent tier to find earlier checkpoints: {error}"
        kept = sorted(owners)[-self.keep :]
        self.memory.persistent_committed = set(kept)
        self.memory.persistent_owners = {step: owners[step] for step in kept}
        if kept:
            newest = kept[-1]
            # Hosts whose shard the newest step lacks (it was saved by a scaled-down world) take a twin's.
            self.joined |= set(self.world.hosts) - owners[newest]
            await self.members.event(f"persistent tier: earlier runs committed step(s) {kept}")
        return None

    def held(self) -> dict[str, Any]:
        """What the job held when it stopped, as the restore plan saw it (for the report)."""
        holdings = self.holdings()
        live = self.members.live()
        return {
            "live": sorted(live),
            "local": {str(h): sorted(steps) for h, steps in holdings.local.items() if steps and h in live},
            "replicas": {
                str(holder): {str(owner): sorted(steps) for owner, steps in owners.items() if steps}
                for holder, owners in holdings.replicas.items()
                if holder in live and any(owners.values())
            },
            "persistent": {
                str(step): sorted(holdings.persistent_owners.get(step, set(range(self.world.full_hosts))))
                for step in sorted(holdings.persistent)
            },
            "invalid": {str(h): sorted(steps) for h, steps in holdings.invalid.items() if steps},
            "job_invalid": sorted(holdings.job_invalid),
            "rejoining": sorted(self.joined),
        }

    def abandon_after(self, restore_step: int | None) -> None:
        """Steps newer than the restore belong to an abandoned timeline: every record drops them."""

        def keep(step: int) -> bool:
            return restore_step is not None and step <= restore_step

        for status in self.status.values():
            status.committed = {s for s in status.committed if keep(s)}
            status.replicas = {o: {s for s in v if keep(s)} for o, v in status.replicas.items()}
            status.invalid = {s for s in status.invalid if keep(s)}  # a re-saved step is a new one
        self.memory.job_invalid = {s for s in self.memory.job_invalid if keep(s)}
        self.memory.persisted = {s: h for s, h in self.memory.persisted.items() if keep(s)}
        self.memory.persistent_committed = {s for s in self.memory.persistent_committed if keep(s)}
        self.joined.clear()
