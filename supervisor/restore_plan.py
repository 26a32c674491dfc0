"""Which checkpoint step the job restores, and where each host takes its shard from.

A step counts only when every host's shard of it is held somewhere valid: in the host's own local
tier, as a replica on a live peer, or in a committed persistent checkpoint. The plan picks the newest
such step and lists, for every host, its sources cheapest first (local, then peers, then persistent);
the host's supervisor tries them in that order and falls back on a checksum mismatch or a missing
copy. Pure: the leader feeds it what the members reported when they stopped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Tier(StrEnum):
    LOCAL = "local"
    PEER = "peer"
    PERSISTENT = "persistent"


@dataclass(frozen=True)
class Source:
    tier: Tier
    holder: int | None = None
    """For the peer tier: the host whose supervisor holds the replica."""

    def to_message(self, addresses: Mapping[int, str]) -> dict[str, Any]:
        message: dict[str, Any] = {"tier": self.tier.value}
        if self.holder is not None:
            message.update(holder=self.holder, address=addresses[self.holder])
        return message


@dataclass(frozen=True)
class RestorePlan:
    step: int | None
    """None: no step is complete anywhere, the job starts from scratch."""
    sources: dict[int, tuple[Source, ...]]


@dataclass
class Holdings:
    """What the job holds, as the members reported it (and the leader knows of the persistent tier)."""

    local: dict[int, set[int]]
    """host -> steps committed in its local tier."""
    replicas: dict[int, dict[int, set[int]]]
    """holder -> owner -> steps of the owner's shard the holder keeps."""
    persistent: set[int]
    """Committed persistent steps (every host's shard uploaded)."""
    invalid: dict[int, set[int]]
    """host -> steps whose shard of that host must never be used (corrupt everywhere, failed save)."""
    job_invalid: set[int]
    """Steps no host may use (e.g. a restore whose first steps gave a non-finite loss)."""


def _sources(holdings: Holdings, host: int, step: int, live: set[int]) -> tuple[Source, ...]:
    if step in holdings.job_invalid or step in holdings.invalid.get(host, set()):
        return ()
    found: list[Source] = []
    if step in holdings.local.get(host, set()):
        found.append(Source(Tier.LOCAL))
    for holder in sorted(holdings.replicas):
        if holder != host and holder in live and step in holdings.replicas[holder].get(host, set()):
            found.append(Source(Tier.PEER, holder))
    if step in holdings.persistent:
        found.append(Source(Tier.PERSISTENT))
    return tuple(found)


def plan_restore(hosts: Iterable[int], holdings: Holdings, live: Iterable[int]) -> RestorePlan:
    """The newest step every host of `hosts` can restore, with each host's sources cheapest first.

    `live` are the hosts whose supervisors (and so their replicas) are reachable now.
    """
    hosts, alive = list(hosts), set(live)
    candidates = set(holdings.persistent)
    for steps in holdings.local.values():
        candidates |= steps
    for owners in holdings.replicas.values():
        for steps in owners.values():
            candidates |= steps
    for step in sorted(candidates, reverse=True):
        sources = {host: _sources(holdings, host, step, alive) for host in hosts}
        if all(sources.values()):
            return RestorePlan(step, sources)
    return RestorePlan(None, {host: () for host in hosts})
