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

`CheckpointTiers` is what the host supervisor holds; the copies after a save are
supervisor.checkpoints.save_copies's, the staging at a start supervisor.checkpoints.staging's, both
over the machine's `TierContext` and whom it serves (supervisor.checkpoints.tier_context).

The machine's disk is `<checkpoint root>/<machine>/`: `local/` (the local tier) and `peers/` (the
replicas it keeps for other hosts). A lost machine loses both.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoint_vocabulary import RestoreSource
from slicekeeper.supervisor.checkpoints import staging
from slicekeeper.supervisor.checkpoints.peer_tier import ReplicaServer, ReplicaStore
from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTier
from slicekeeper.supervisor.checkpoints.save_copies import SaveCopies
from slicekeeper.supervisor.checkpoints.staging import Staged
from slicekeeper.supervisor.checkpoints.tier_context import Serving, TierContext
from slicekeeper.supervisor.metrics import SupervisorMetrics
from slicekeeper.supervisor.reporting import Log, Report
from slicekeeper.supervisor.tls import JobTls

from slicekeeper import shard_folder
from slicekeeper.api import CheckpointSpec
from slicekeeper.shape import JobShape
from slicekeeper.shard_folder import CorruptCheckpoint

SAVE_DUE_SECONDS = 10.0
"""How long chaos `corrupt` waits for the save it is due to corrupt (`corrupt_newest_at_rest`)."""
SAVE_DUE_POLL_SECONDS = 0.05


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
        local_dir = disk / "local"
        local_dir.mkdir(parents=True, exist_ok=True)
        self._context = TierContext(
            disk=disk,
            local_dir=local_dir,
            replicas=ReplicaStore(disk / "peers", spec.peer.max_to_keep),
            persistent=persistent,
            spec=spec,
            shape=shape,
            metrics=metrics,
            report=report,
            log=log,
            tls=tls,
            connection_deadline=connection_deadline,
        )
        self._serving = Serving()
        self._server = ReplicaServer(
            self._context.replicas, own_copy=self._own_copy, tls=tls, connection_deadline=connection_deadline
        )
        self._copies = SaveCopies(self._context, self._serving)

    @property
    def disk(self) -> Path:
        return self._context.disk

    @property
    def local_dir(self) -> Path:
        return self._context.local_dir

    @property
    def replicas(self) -> ReplicaStore:
        return self._context.replicas

    @property
    def persistent(self) -> PersistentTier | None:
        return self._context.persistent

    @property
    def host(self) -> int | None:
        """The host this machine serves (None: not yet claimed)."""
        return self._serving.host

    @host.setter
    def host(self, host: int | None) -> None:
        self._serving.host = host

    async def serve(self, address: str, advertise: str | None = None) -> str:
        """Start the replica endpoint on `address`; returns the `host:port` peers reach it at
        (`advertise`: the host name or IP they use, when not `address`)."""
        port = await self._server.serve(address, 0)
        self._copies.start()
        return f"{advertise or address}:{port}"

    async def close(self) -> None:
        self._copies.stop()
        await self._server.close()

    # --- after a save: copies to the other tiers ----------------------------------------------
    def saved(self, step: int) -> None:
        """The workload committed `step` in the local tier: queue its copies (never blocks)."""
        self._copies.saved(step)

    def pause(self) -> None:
        """The workload is being stopped: drop the copies not started (a push under way finishes)."""
        self._copies.pause()

    def start_generation(
        self, generation: int, addresses: dict[int, str], world: list[int] | None = None
    ) -> None:
        """A new generation: the peers' addresses, and the hosts taking part (replicas go only to them)."""
        self._serving.generation = generation
        self._serving.addresses = addresses
        self._serving.world = world

    def _own_copy(self, owner: int, step: int) -> Path | None:
        """This host's committed local step, served to a rejoining twin (checkpoints.restore_plan)."""
        folder = shard_folder.step_dir(self.local_dir, step)
        if owner != self.host or step not in shard_folder.committed_steps(self.local_dir):
            return None
        return folder

    async def drain(self) -> None:
        """Wait until every queued copy is done: the final checkpoint must reach every tier."""
        await self._copies.drain()

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
        """Bring this host's shard of `step` into the local tier from the first valid source
        (supervisor.checkpoints.staging)."""
        assert self.host is not None
        return await staging.stage(self._context, self.host, step, sources)

    # --- chaos --------------------------------------------------------------------------------
    def wipe(self) -> None:
        """The machine is lost: its disk (local tier and held replicas) goes with it."""
        shutil.rmtree(self.disk, ignore_errors=True)

    async def corrupt_newest_at_rest(self, due: int | None = None) -> int | None:
        """Chaos `corrupt`: bytes flipped in the newest committed local step once the copies of the
        saves queued so far are done: a corruption at rest, which a restore takes from a peer. (A copy
        under way reads the flipped bytes, refuses them, and the step then has no valid copy at all:
        the restore falls back to an older step, a different fault; on a loaded machine a step's
        push can take longer than the few steps between its save and the corruption.)

        `due`: the step the workload should have saved by now (the newest multiple of its save
        interval before the step the fault fired at), waited for while this generation lasts, at most
        SAVE_DUE_SECONDS: on a loaded machine its save was still being written three steps later,
        and the step before it was corrupted instead, a step no restore then read (a whole run of
        the suite). That step itself is corrupted once saved, not the newest: a host that does not
        wait for the others may have saved the next one meanwhile, which no restore reads while a
        killed host lacks it (a whole run of the suite)."""
        generation, deadline = self._serving.generation, time.monotonic() + SAVE_DUE_SECONDS
        while (
            due is not None
            and (self._copies.newest_saved() or 0) < due
            and self._serving.generation == generation
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(SAVE_DUE_POLL_SECONDS)
        await self._copies.drain()
        return self.corrupt_newest(at_most=due)

    def corrupt_newest(self, at_most: int | None = None) -> int | None:
        """Flip bytes in the newest committed local step (at most `at_most`: the newest before it if
        that step was never committed), in its largest shard file; returns the step."""
        steps = [
            step
            for step in shard_folder.committed_steps(self.local_dir)
            if at_most is None or step <= at_most
        ]
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
