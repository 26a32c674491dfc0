"""A host supervisor's share of the checkpoint tiers: replicate, persist, stage back, inventory.

The workload only ever writes and reads its local tier (fast, RAM-backed). Everything else happens
here, in the supervisor, off the training process's critical path:

- after each committed local save, the step folder is pushed to this host's peer holders over TCP
  (supervisor.checkpoints.peer_tier; a push that fails is tried again after a pause, at most
  PUSH_ATTEMPTS times, unless a newer save came meanwhile: the peers then get that one) and, every
  `persistent.interval` steps, uploaded to the persistent tier;
- at a restart, before the workload starts, this host's shard of the agreed step is staged into the
  local tier from the first source that holds a valid copy (local, a peer, persistent), verifying
  checksums and falling back on any mismatch or missing copy;
- when the workload is stopped, what this machine holds is listed for the leader.

The machine's disk is `<checkpoint root>/<machine>/`: `local/` (the local tier) and `peers/` (the
replicas it keeps for other hosts). A lost machine loses both.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoints import store_calls
from slicekeeper.supervisor.checkpoints.peer_tier import (
    ReplicaServer,
    ReplicaStore,
    ReplicationError,
    Transfer,
    fetch_replica,
    push_replica,
    replica_holders,
)
from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTier, PersistentTierError
from slicekeeper.supervisor.checkpoints.restore_plan import RestoreSource, Tier, describe
from slicekeeper.supervisor.metrics import SupervisorMetrics
from slicekeeper.supervisor.reporting import Log, Report
from slicekeeper.supervisor.tls import JobTls

from slicekeeper import shard_folder
from slicekeeper.api import CheckpointSpec
from slicekeeper.shape import JobShape
from slicekeeper.shard_folder import CorruptCheckpoint

PUSH_ATTEMPTS = 3
"""Tries of one push to one holder (each under the peer tier's own time limit)."""
PUSH_BACKOFF_SECONDS = 1.0
"""The pause before the second try, doubled before each later one."""


@dataclass(frozen=True)
class Staged:
    step: int
    tier: Tier
    holder: int | None
    seconds: float
    bytes: int


class CheckpointTiers:
    def __init__(
        self,
        disk: Path,
        spec: CheckpointSpec,
        *,
        shape: JobShape,
        persistent: PersistentTier | None,
        metrics: SupervisorMetrics,
        report: Report,
        log: Log,
        tls: JobTls | None = None,
        connection_deadline: float = 0.0,
    ) -> None:
        """`tls`: the job's credentials for the peer tier's connections (None: plain TCP);
        `connection_deadline`: their seconds of silence before they end (0: none)."""
        self.disk = disk
        self._tls = tls
        self._deadline = connection_deadline
        self.local_dir = disk / "local"
        self.local_dir.mkdir(parents=True, exist_ok=True)
        self.replicas = ReplicaStore(disk / "peers", spec.peer.max_to_keep)
        self._server = ReplicaServer(
            self.replicas, own_copy=self._own_copy, tls=tls, connection_deadline=connection_deadline
        )
        self._spec = spec
        self._shape = shape
        self.persistent = persistent
        self._metrics, self._report, self._log = metrics, report, log
        self.host: int | None = None
        self.generation = -1
        self._addresses: dict[int, str] = {}
        self._world: list[int] | None = None
        self._queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._newest: tuple[int, int] = (-1, 0)
        """(generation, step) of the newest save queued: an older one's peer copy is skipped."""

    async def serve(self, address: str, advertise: str | None = None) -> str:
        """Start the replica endpoint on `address`; returns the `host:port` peers reach it at
        (`advertise`: the host name or IP they use, when not `address`)."""
        port = await self._server.serve(address, 0)
        self._worker = asyncio.create_task(self._copy_saved_steps())
        return f"{advertise or address}:{port}"

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
        await self._server.close()

    # --- after a save: copies to the other tiers ----------------------------------------------
    def saved(self, step: int) -> None:
        """The workload committed `step` in the local tier: queue its copies (never blocks)."""
        self._newest = max(self._newest, (self.generation, step))
        self._queue.put_nowait((self.generation, step))

    def pause(self) -> None:
        """The workload is being stopped: drop the copies not started (a push under way finishes)."""
        while not self._queue.empty():
            self._queue.get_nowait()
            self._queue.task_done()

    def start_generation(
        self, generation: int, addresses: dict[int, str], world: list[int] | None = None
    ) -> None:
        """A new generation: the peers' addresses, and the hosts taking part (replicas go only to them)."""
        self.generation = generation
        self._addresses = addresses
        self._world = world

    def _own_copy(self, owner: int, step: int) -> Path | None:
        """This host's committed local step, served to a rejoining twin (checkpoints.restore_plan)."""
        folder = shard_folder.step_dir(self.local_dir, step)
        if owner != self.host or step not in shard_folder.committed_steps(self.local_dir):
            return None
        return folder

    async def drain(self) -> None:
        """Wait until every queued copy is done: the final checkpoint must reach every tier."""
        await self._queue.join()

    async def _copy_saved_steps(self) -> None:
        while True:
            generation, step = await self._queue.get()
            try:
                await self._copy(generation, step)
            finally:
                self._queue.task_done()

    async def _copy(self, generation: int, step: int) -> None:
        if generation != self.generation or self.host is None:
            return  # a save of a generation being torn down
        folder = shard_folder.step_dir(self.local_dir, step)
        if not folder.is_dir():
            return  # already gone by retention
        if self._newest <= (generation, step):
            await self._replicate(step, folder)
        # else a newer save is queued: the peers get that one. When saves come faster than pushes,
        # pushing every one in turn only falls further behind (the workload's retention then deletes
        # steps before they are pushed), and the newest copy is the one a restore can use: every
        # other host still holds that step locally.
        persistent = self._spec.persistent
        if self.persistent is not None and persistent is not None and step % persistent.interval == 0:
            await self._persist(step, folder)

    async def _replicate(self, step: int, folder: Path) -> None:
        assert self.host is not None
        holders = replica_holders(
            self.host,
            self._shape.host_count,
            self._shape.hosts_per_slice,
            self._spec.peer.replicas,
            self._world,
        )
        for holder in holders:
            address = self._addresses.get(holder)
            if address is None:
                continue
            transfer = await self._push(step, folder, holder, address)
            if transfer is None:
                continue
            self._metrics.checkpoint_transfer.labels(tier="peer", direction="save").observe(transfer.seconds)
            self._log(
                {
                    "source": "supervisor",
                    "type": "replicated",
                    "step": step,
                    "holder": holder,
                    "seconds": round(transfer.seconds, 4),
                    "bytes": transfer.bytes,
                }
            )

    async def _push(self, step: int, folder: Path, holder: int, address: str) -> Transfer | None:
        """`step` pushed to `holder`, tried again after a pause while it is still the newest save;
        None when it failed (said as a failed replication) or was superseded."""
        assert self.host is not None
        pause = PUSH_BACKOFF_SECONDS
        for attempt in range(1, PUSH_ATTEMPTS + 1):
            try:
                return await push_replica(
                    address, self.host, folder, tls=self._tls, connection_deadline=self._deadline
                )
            except CorruptCheckpoint as error:  # our own copy is bad: no second try mends that
                await self._failed(step, Tier.PEER, "replication failed", f"to host {holder}: {error}")
                return None
            except (ReplicationError, OSError) as error:
                superseded = self._newest > (self.generation, step)
                if attempt == PUSH_ATTEMPTS or superseded or not folder.is_dir():
                    tries = f" (try {attempt} of {PUSH_ATTEMPTS})"
                    await self._failed(
                        step, Tier.PEER, "replication failed", f"to host {holder}: {error}{tries}"
                    )
                    return None
            await asyncio.sleep(pause)
            pause *= 2
        return None

    async def _persist(self, step: int, folder: Path) -> None:
        assert self.host is not None and self.persistent is not None
        started = time.time()
        try:
            size = await store_calls.call(
                self.persistent, f"upload of step {step}", self.persistent.upload, self.host, folder
            )
        except (PersistentTierError, CorruptCheckpoint, OSError) as error:
            await self._failed(step, Tier.PERSISTENT, "upload failed", str(error))
            return
        seconds = time.time() - started
        self._metrics.checkpoint_transfer.labels(tier="persistent", direction="save").observe(seconds)
        self._log(
            {
                "source": "supervisor",
                "type": "persisted",
                "step": step,
                "seconds": round(seconds, 4),
                "bytes": size,
            }
        )
        await self._report(messages.Persisted(step=step))

    async def _failed(self, step: int, tier: Tier, reason: str, detail: str) -> None:
        """A copy that failed: logged, counted, reported; training goes on without that copy."""
        self._metrics.checkpoint_failures.labels(tier=tier.value).inc()
        self._warn("checkpoint_failed", step, tier, detail, f"{tier.value} copy of step {step}: {reason}")
        await self._report(
            messages.CheckpointInvalid(step=step, tier=tier.value, reason=reason, detail=detail)
        )

    # --- at a stop: what this machine holds ---------------------------------------------------
    def stopped(self, generation: int) -> messages.Stopped:
        """The acknowledgement of `generation`'s stop, read from disk with the workload dead: committed
        local steps and the replicas held."""
        return messages.Stopped(
            generation=generation,
            committed=shard_folder.committed_steps(self.local_dir),
            replicas=self.replicas.inventory(),
        )

    def discard_after(self, step: int | None) -> None:
        """Drop local steps and replicas newer than the agreed step: an abandoned timeline.

        Called with no workload running, before the next one starts, so a workload that dies before
        its own restore cannot leave a step of the abandoned timeline to be listed at the next stop.
        """
        for held in shard_folder.committed_steps(self.local_dir):
            if step is None or held > step:
                shutil.rmtree(shard_folder.step_dir(self.local_dir, held), ignore_errors=True)
        for owner, steps in self.replicas.inventory().items():
            for held in steps:
                if step is None or held > step:
                    shutil.rmtree(self.replicas.folder(owner, held), ignore_errors=True)

    # --- at a start: this host's shard of the agreed step, into the local tier ----------------
    async def stage(self, step: int, sources: Sequence[RestoreSource]) -> Staged | None:
        """Bring this host's shard of `step` into the local tier from the first valid source.

        A source with an `owner` is a twin's copy (the same worker in another slice, whose shard equals
        this host's): how a host rejoining after a scale-down catches up."""
        assert self.host is not None
        for source in sources:
            tier, holder = Tier(source["tier"]), source.get("holder")
            started = time.time()
            try:
                size = await self._fetch(step, tier, source)
            except CorruptCheckpoint as error:
                await self._source_failed(step, tier, holder, f"corrupt: {error}")
                if tier is Tier.LOCAL:
                    shard_folder.quarantine(shard_folder.step_dir(self.local_dir, step))
                    await self._report(
                        messages.CheckpointInvalid(
                            step=step, tier="local", reason="corrupt", detail=str(error)
                        )
                    )
                continue
            except (ReplicationError, PersistentTierError, OSError) as error:
                await self._source_failed(step, tier, holder, str(error))
                continue
            seconds = time.time() - started
            self._metrics.checkpoint_transfer.labels(tier=tier.value, direction="restore").observe(seconds)
            self._metrics.restores.labels(tier=tier.value).inc()
            staged = Staged(step, tier, holder, seconds, size)
            self._log({"source": "supervisor", "type": "staged", **vars(staged)})
            return staged
        return None

    async def _fetch(self, step: int, tier: Tier, source: RestoreSource) -> int:
        assert self.host is not None
        if tier is Tier.LOCAL:
            manifest = await asyncio.to_thread(
                shard_folder.verify, shard_folder.step_dir(self.local_dir, step)
            )
            return manifest.total_bytes
        # A copy from elsewhere replaces whatever stale or partial folder is here.
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(shard_folder.step_dir(self.local_dir, step))
        owner = source.get("owner", self.host)
        if tier is Tier.PEER:
            address = source.get("address")
            if address is None:
                raise ReplicationError(f"{describe(source)}: no address to fetch it from")
            transfer = await fetch_replica(
                address, owner, step, self.local_dir, tls=self._tls, connection_deadline=self._deadline
            )
            return transfer.bytes
        if self.persistent is None:
            raise PersistentTierError("this job has no persistent tier (spec.checkpoint.persistent)")
        what = f"download of host {owner}'s step {step}"
        return await store_calls.call(
            self.persistent, what, self.persistent.download, owner, step, self.local_dir
        )

    async def _source_failed(self, step: int, tier: Tier, holder: int | None, detail: str) -> None:
        where = tier.value + (f" (host {holder})" if holder is not None else "")
        self._warn(
            "stage_failed", step, tier, detail, f"step {step} from {where} unusable, trying the next source"
        )

    def _warn(self, kind: str, step: int, tier: Tier, detail: str, text: str) -> None:
        """A copy or restore source that did not work: into the event log and onto stderr."""
        self._log({"source": "supervisor", "type": kind, "step": step, "tier": tier.value, "detail": detail})
        print(f"[host {self.host}] {text}: {detail}", file=sys.stderr, flush=True)

    # --- chaos --------------------------------------------------------------------------------
    def wipe(self) -> None:
        """The machine is lost: its disk (local tier and held replicas) goes with it."""
        shutil.rmtree(self.disk, ignore_errors=True)

    def corrupt_newest(self) -> int | None:
        """Flip bytes in the newest committed local step (its largest shard file); returns the step."""
        steps = shard_folder.committed_steps(self.local_dir)
        if not steps:
            return None
        folder = shard_folder.step_dir(self.local_dir, steps[-1])
        try:
            manifest = shard_folder.read_manifest(folder)
            target = folder / max(manifest.shards, key=lambda s: s.size).file
            data = bytearray(target.read_bytes())
            for offset in range(len(data) // 2, min(len(data), len(data) // 2 + 8)):
                data[offset] ^= 0xFF
            target.write_bytes(bytes(data))
        except (OSError, CorruptCheckpoint, ValueError):
            return None  # removed by retention meanwhile
        return steps[-1]
