"""The checkpoint tiers' words that the rest of the supervisor names too: a tier, a restore source on
the wire, the persistent tier's read counts.

The tiers' modules (supervisor.checkpoints) send messages (supervisor.messages) and count in the
host's metrics (supervisor.metrics), and those two name a tier and a source in turn: the words live
here, below all three, so that each folder's imports go one way. Plain values only: no module of the
supervisor is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Required

from pydantic import AfterValidator
from typing_extensions import TypedDict  # pydantic validates a TypedDict from here on Python < 3.12


class Tier(StrEnum):
    LOCAL = "local"
    PEER = "peer"
    PERSISTENT = "persistent"


class RestoreSource(TypedDict, total=False):
    """Where a host stages its shard of the restore step from, as the leader's `start` lists it
    (supervisor.messages.Start validates it). A TypedDict of plain JSON values: on the wire a source
    names only what it has (`{"tier": "local"}`)."""

    tier: Required[Annotated[str, AfterValidator(lambda name: Tier(name).value)]]
    """A `Tier`'s value."""
    holder: int
    """For the peer tier: the host whose supervisor holds the copy."""
    address: str
    """For the peer tier: where the holder's supervisor serves its copies."""
    owner: int
    """Whose shard the copy is, when not the restoring host's own: a twin's."""


@dataclass
class StoreReads:
    """What one PersistentTier instance (supervisor.checkpoints.persistent_tier) read from the store,
    counted at each read."""

    shards: int = 0
    """Host shards downloaded (complete or not): restores served by the store."""
    objects: int = 0
    """Objects opened for reading: shard files, manifests, COMMITTED markers."""
    bytes: int = 0
    """Bytes read from those objects."""
