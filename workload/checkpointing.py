"""Checkpointing through the supervisor's tiers, for any training loop (numpy arrays in, out).

The loop hands over a snapshot of its shards every `interval` steps; the copy is written in the
background (workload.local_tier) and the supervisor hears of it only once it is committed, so a
step that was never fully written can never be chosen for a restore. Restores take the step every
host agreed on (`identity.restore_step`) and drop newer local steps, which not every host holds.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from pathlib import Path

from slicekeeper.workload.local_tier import CorruptCheckpoint, LocalTier, Shards
from slicekeeper.workload.sdk import Session

from slicekeeper.protocol import Phase
from slicekeeper.shard_folder import Layout


class Checkpointer:
    def __init__(
        self,
        session: Session,
        directory: str | Path | None = None,
        interval: int | None = None,
        keep: int | None = None,
        layout: Layout | None = None,
    ) -> None:
        identity = session.identity
        self._session = session
        self.interval = interval or identity.checkpoint_interval
        folder = directory or identity.checkpoint_dir or f"/tmp/slicekeeper-standalone/host-{identity.host}"
        self.tier = LocalTier(folder, keep or identity.checkpoint_keep)
        self._pending: list[tuple[int, Future[None]]] = []
        self.layout = layout
        """What the saved leaves are (kept in every step's manifest): what lets `slicekeeper
        checkpoint export` name them. Without it the shards are saved and restored all the same."""

    def restore(self, step: int | None) -> Shards | None:
        """This host's verified shards of `step`, or None for a fresh start (step None)."""
        self.tier.discard_after(step)
        if step is None:
            return None
        with self._session.phase(Phase.CHECKPOINT_RESTORE):
            try:
                # Under a supervisor the shard was staged and verified just before this process
                # started; hashing a large checkpoint twice would only lengthen the restart.
                shards = self.tier.restore(step, verify=not self._session.identity.restore_verified)
            except CorruptCheckpoint as error:
                # Set it aside and tell the supervisor before dying: the next attempt agrees on an
                # older step.
                self.tier.quarantine(step)
                self._session.checkpoint_failed(
                    step, tier="local", reason=f"corrupt at restore: {error}", during="restore"
                )
                raise
        self._session.checkpoint_restored(step, tier="local")
        return shards

    def maybe_save(self, step: int, snapshot: Callable[[], Shards]) -> None:
        """Report saves that finished since the last call; save `snapshot()` when `step` is due.

        `snapshot` must return copies: the loop goes on changing its state while the write runs.
        """
        self.poll()
        on_notice = self._session.save_requested(step)
        if step % self.interval and not on_notice:
            return
        with self._session.phase(Phase.CHECKPOINT_SAVE):
            shards = snapshot()  # the blocking part of a save
        self._pending.append((step, self.tier.save_async(step, shards, self.layout)))
        if on_notice:
            # A machine of the job goes soon: this step must be committed and said before anything,
            # and no later step trained (the restart that follows would only train it again).
            with self._session.phase(Phase.CHECKPOINT_SAVE):
                self.tier.close()
            self.poll()
            self._session.hold()

    def poll(self) -> None:
        """Report every finished save; a failed one is reported as failed, never as committed."""
        while self._pending and self._pending[0][1].done():
            step, future = self._pending.pop(0)
            error = future.exception()
            if error is None:
                self._session.checkpoint_saved(step, tier="local")
            else:
                print(f"slicekeeper: local checkpoint of step {step} failed: {error!r}", file=sys.stderr)
                self._session.checkpoint_failed(step, tier="local", reason=repr(error))

    def flush(self) -> None:
        """Wait for the saves under way and report them; later saves go on as before."""
        futures_wait([future for _, future in self._pending])
        self.poll()

    def close(self) -> None:
        """Wait for the saves under way and report them."""
        self.tier.close()
        self.poll()
