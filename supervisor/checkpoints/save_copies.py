"""After each committed local save, its copies to the other tiers, off the training's critical path.

The step folder is pushed to this host's peer holders over TCP (supervisor.checkpoints.peer_tier; a
push that fails is tried again after a pause, at most PUSH_ATTEMPTS times, unless a newer save came
meanwhile: the peers then get that one) and, every `persistent.interval` steps, uploaded to the
persistent tier. A copy that fails is logged, counted and reported; training goes on without it.

A step due for the persistent tier is kept for its upload the moment its save is heard of (its files
hard-linked under PINNED): the workload's own retention deletes local steps a few saves later, and
when the copies fall behind (a slow push, a loaded machine) the due step was gone before its upload,
so that host's shard of it never reached the persistent tier and the job's persistent steps skipped
it (the likeliest cause of a CI run where a job's first persistent step was never committed). A due
step gone before it could be kept is said as a failed copy ("upload skipped"), never passed over.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from pathlib import Path

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoint_vocabulary import Tier
from slicekeeper.supervisor.checkpoints import store_calls
from slicekeeper.supervisor.checkpoints.peer_tier import (
    ReplicationError,
    Transfer,
    push_replica,
    replica_holders,
)
from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTierError
from slicekeeper.supervisor.checkpoints.tier_context import Serving, TierContext

from slicekeeper import shard_folder
from slicekeeper.shard_folder import CorruptCheckpoint

PUSH_ATTEMPTS = 3
"""Tries of one push to one holder (each under the peer tier's own time limit)."""
PUSH_BACKOFF_SECONDS = 1.0
"""The pause before the second try, doubled before each later one."""
PINNED = ".persisting"
"""The local tier's sub-folder where steps due for the persistent tier wait for their upload (not a
step folder: the workload's retention and the restores never see it)."""


class SaveCopies:
    def __init__(self, context: TierContext, serving: Serving) -> None:
        self._context = context
        self._serving = serving
        self._queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._newest: tuple[int, int] = (-1, 0)
        """(generation, step) of the newest save queued: an older one's peer copy is skipped."""

    def start(self) -> None:
        """Copy the saves queued from now on, one at a time (steps kept for an upload by an earlier
        supervisor of this host are dropped: their generation is over)."""
        shutil.rmtree(self._context.local_dir / PINNED, ignore_errors=True)
        self._worker = asyncio.create_task(self._copy_saved_steps())

    def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()

    def saved(self, step: int) -> None:
        """The workload committed `step` in the local tier: queue its copies (never blocks)."""
        generation = self._serving.generation
        self._newest = max(self._newest, (generation, step))
        if self._persistent_due(step):
            self._pin(generation, step)
        self._queue.put_nowait((generation, step))

    def pause(self) -> None:
        """The workload is being stopped: drop the copies not started (a push under way finishes)."""
        while not self._queue.empty():
            self._unpin(*self._queue.get_nowait())
            self._queue.task_done()

    async def drain(self) -> None:
        """Wait until every queued copy is done: the final checkpoint must reach every tier."""
        await self._queue.join()

    def newest_saved(self) -> int | None:
        """The newest step the workload of this generation said it saved (None: none yet)."""
        generation, step = self._newest
        return step if generation == self._serving.generation else None

    async def _copy_saved_steps(self) -> None:
        while True:
            generation, step = await self._queue.get()
            try:
                await self._copy(generation, step)
            finally:
                self._queue.task_done()

    async def _copy(self, generation: int, step: int) -> None:
        try:
            if generation != self._serving.generation or self._serving.host is None:
                return  # a save of a generation being torn down
            folder = shard_folder.step_dir(self._context.local_dir, step)
            if folder.is_dir() and self._newest <= (generation, step):
                await self._replicate(step, folder)
            # Else gone by retention, or a newer save is queued: the peers get that one. When saves
            # come faster than pushes, pushing every one in turn only falls further behind (the
            # workload's retention then deletes steps before they are pushed), and the newest copy
            # is the one a restore can use: every other host still holds that step locally.
            if self._persistent_due(step):
                kept = self._pinned(generation, step)
                if kept.is_dir():
                    await self._persist(step, kept)
                else:
                    await self._failed(
                        step,
                        Tier.PERSISTENT,
                        "upload skipped",
                        f"{folder} was gone before it could be kept for its upload",
                    )
        finally:
            self._unpin(generation, step)

    def _persistent_due(self, step: int) -> bool:
        persistent = self._context.spec.persistent
        return (
            self._context.persistent is not None
            and persistent is not None
            and step % persistent.interval == 0
        )

    def _pinned(self, generation: int, step: int) -> Path:
        """Per generation: a generation restarted from an older step saves the same step again
        while the last one's upload of it may still be reading its files."""
        return shard_folder.step_dir(self._context.local_dir / PINNED / f"generation-{generation}", step)

    def _pin(self, generation: int, step: int) -> None:
        """Keep `step`'s files for its upload (hard links: no copy, and the workload's retention
        deleting the step folder leaves them); nothing is kept when the folder is already gone."""
        folder, kept = shard_folder.step_dir(self._context.local_dir, step), self._pinned(generation, step)
        shutil.rmtree(kept, ignore_errors=True)
        try:
            shutil.copytree(folder, kept, copy_function=os.link)
        except (OSError, shutil.Error):
            shutil.rmtree(kept, ignore_errors=True)

    def _unpin(self, generation: int, step: int) -> None:
        kept = self._pinned(generation, step)
        shutil.rmtree(kept, ignore_errors=True)
        with contextlib.suppress(OSError):  # the generation's folder, once it keeps nothing
            kept.parent.rmdir()

    async def _replicate(self, step: int, folder: Path) -> None:
        context, serving = self._context, self._serving
        assert serving.host is not None
        holders = replica_holders(
            serving.host,
            context.shape.host_count,
            context.shape.hosts_per_slice,
            context.spec.peer.replicas,
            serving.world,
        )
        for holder in holders:
            address = serving.addresses.get(holder)
            if address is None:
                continue
            transfer = await self._push(step, folder, holder, address)
            if transfer is None:
                continue
            context.metrics.checkpoint_transfer.labels(tier="peer", direction="save").observe(
                transfer.seconds
            )
            context.log(
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
        context, serving = self._context, self._serving
        assert serving.host is not None
        pause = PUSH_BACKOFF_SECONDS
        for attempt in range(1, PUSH_ATTEMPTS + 1):
            try:
                return await push_replica(
                    address,
                    serving.host,
                    folder,
                    tls=context.tls,
                    connection_deadline=context.connection_deadline,
                )
            except CorruptCheckpoint as error:  # our own copy is bad: no second try mends that
                await self._failed(step, Tier.PEER, "replication failed", f"to host {holder}: {error}")
                return None
            except (ReplicationError, OSError) as error:
                superseded = self._newest > (serving.generation, step)
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
        context, host = self._context, self._serving.host
        assert host is not None and context.persistent is not None
        started = time.time()
        try:
            size = await store_calls.call(
                context.persistent, f"upload of step {step}", context.persistent.upload, host, folder
            )
        except (PersistentTierError, CorruptCheckpoint, OSError) as error:
            await self._failed(step, Tier.PERSISTENT, "upload failed", str(error))
            return
        seconds = time.time() - started
        context.metrics.checkpoint_transfer.labels(tier="persistent", direction="save").observe(seconds)
        context.log(
            {
                "source": "supervisor",
                "type": "persisted",
                "step": step,
                "seconds": round(seconds, 4),
                "bytes": size,
            }
        )
        await context.report(messages.Persisted(step=step))

    async def _failed(self, step: int, tier: Tier, reason: str, detail: str) -> None:
        """A copy that failed: logged, counted, reported; training goes on without that copy."""
        context = self._context
        context.metrics.checkpoint_failures.labels(tier=tier.value).inc()
        context.warn(
            self._serving.host,
            "checkpoint_failed",
            step,
            tier,
            detail,
            f"{tier.value} copy of step {step}: {reason}",
        )
        await context.report(
            messages.CheckpointInvalid(step=step, tier=tier.value, reason=reason, detail=detail)
        )
