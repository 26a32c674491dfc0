"""At a restart, before the workload starts: this host's shard of the agreed step, staged into the
local tier from the first source that holds a valid copy (local, a peer, persistent), verifying
checksums and falling back on any mismatch or missing copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoint_vocabulary import RestoreSource, Tier
from slicekeeper.supervisor.checkpoints import store_calls
from slicekeeper.supervisor.checkpoints.peer_tier import ReplicationError, fetch_replica
from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTierError
from slicekeeper.supervisor.checkpoints.restore_plan import describe
from slicekeeper.supervisor.checkpoints.tier_context import TierContext

from slicekeeper import shard_folder
from slicekeeper.shard_folder import CorruptCheckpoint


@dataclass(frozen=True)
class Staged:
    step: int
    tier: Tier
    holder: int | None
    seconds: float
    bytes: int


async def stage(
    context: TierContext, host: int, step: int, sources: Sequence[RestoreSource]
) -> Staged | None:
    """Bring `host`'s shard of `step` into the local tier from the first valid source of `sources`.

    A source with an `owner` is a twin's copy (the same worker in another slice, whose shard equals
    this host's): how a host rejoining after a scale-down catches up."""
    for source in sources:
        tier, holder = Tier(source["tier"]), source.get("holder")
        started = time.time()
        try:
            size = await _fetch(context, host, step, tier, source)
        except CorruptCheckpoint as error:
            _source_failed(context, host, step, tier, holder, f"corrupt: {error}")
            if tier is Tier.LOCAL:
                shard_folder.quarantine(shard_folder.step_dir(context.local_dir, step))
                await context.report(
                    messages.CheckpointInvalid(step=step, tier="local", reason="corrupt", detail=str(error))
                )
            continue
        except (ReplicationError, PersistentTierError, OSError) as error:
            _source_failed(context, host, step, tier, holder, str(error))
            continue
        seconds = time.time() - started
        context.metrics.checkpoint_transfer.labels(tier=tier.value, direction="restore").observe(seconds)
        context.metrics.restores.labels(tier=tier.value).inc()
        staged = Staged(step, tier, holder, seconds, size)
        context.log({"source": "supervisor", "type": "staged", **vars(staged)})
        return staged
    return None


async def _fetch(context: TierContext, host: int, step: int, tier: Tier, source: RestoreSource) -> int:
    """The shard's bytes, once its copy from `source` is in the local tier and verified."""
    local_dir = context.local_dir
    if tier is Tier.LOCAL:
        manifest = await asyncio.to_thread(shard_folder.verify, shard_folder.step_dir(local_dir, step))
        return manifest.total_bytes
    # A copy from elsewhere replaces whatever stale or partial folder is here.
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(shard_folder.step_dir(local_dir, step))
    owner = source.get("owner", host)
    if tier is Tier.PEER:
        address = source.get("address")
        if address is None:
            raise ReplicationError(f"{describe(source)}: no address to fetch it from")
        transfer = await fetch_replica(
            address, owner, step, local_dir, tls=context.tls, connection_deadline=context.connection_deadline
        )
        return transfer.bytes
    if context.persistent is None:
        raise PersistentTierError("this job has no persistent tier (spec.checkpoint.persistent)")
    what = f"download of host {owner}'s step {step}"
    return await store_calls.call(
        context.persistent, what, context.persistent.download, owner, step, local_dir
    )


def _source_failed(
    context: TierContext, host: int, step: int, tier: Tier, holder: int | None, detail: str
) -> None:
    where = tier.value + (f" (host {holder})" if holder is not None else "")
    context.warn(
        host, "stage_failed", step, tier, detail, f"step {step} from {where} unusable, trying the next source"
    )
