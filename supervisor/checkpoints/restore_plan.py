"""Which checkpoint step the job restores, and where each host takes its shard from.

A step counts only when every host's shard of it is held somewhere valid: in the host's own local
tier, as a replica on a live peer, or in a committed persistent checkpoint. The plan picks the newest
such step and lists, for every host, its sources cheapest first (local, then peers, then persistent);
the host's supervisor tries them in that order and falls back on a checksum mismatch or a missing
copy. Pure: the leader feeds it what the members reported when they stopped.

Elastic scaling adds twins: slices are data-parallel replicas, so a host's shard equals the shard of
the same worker in any other slice. A host that rejoins the job (its slice was dropped and comes back)
holds nothing of the steps trained without it; it may take a twin's copy instead, listed after its own
sources. Twins are offered only for such hosts: for every other host, its own shard is the truth.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from slicekeeper.supervisor.checkpoint_vocabulary import RestoreSource, Tier


@dataclass(frozen=True)
class Source:
    tier: Tier
    holder: int | None = None
    """For the peer tier: the host whose supervisor holds the copy (a replica, or its own local step)."""
    owner: int | None = None
    """Whose shard the copy is, when not the restoring host's own: a twin's (same worker, other slice)."""

    def to_message(self, addresses: Mapping[int, str]) -> RestoreSource:
        """This source as the host restoring from it is told it; `addresses`: where each host's
        supervisor serves its copies (the peer tier)."""
        message = RestoreSource(tier=self.tier.value)
        if self.holder is not None:
            message["holder"], message["address"] = self.holder, addresses[self.holder]
        if self.owner is not None:
            message["owner"] = self.owner
        return message


def describe(source: RestoreSource) -> str:
    """`peer (host 3)`: a source, in a line saying which sources were tried."""
    holder = source.get("holder")
    return Tier(source["tier"]).value + (f" (host {holder})" if holder is not None else "")


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
    persistent_owners: dict[int, set[int]] = field(default_factory=dict)
    """Persistent step -> hosts whose shard it holds (absent: every host; a smaller world uploads fewer)."""

    @functools.cached_property
    def _holders(self) -> dict[int, list[int]]:
        holders: dict[int, list[int]] = {}
        for holder in sorted(self.replicas):
            for owner in self.replicas[holder]:
                holders.setdefault(owner, []).append(holder)
        return holders

    def holders_of(self, owner: int) -> list[int]:
        """The hosts that keep replicas of `owner`'s shard, in order (found once for every owner: a
        look at every holder for each host would cost the square of the job's size)."""
        return self._holders.get(owner, [])


def _own_sources(holdings: Holdings, owner: int, step: int, live: set[int], host: int) -> list[Source]:
    """Where `owner`'s shard of `step` is held, cheapest first, as seen by `host` (who restores it)."""
    if step in holdings.invalid.get(owner, set()):
        return []
    tagged = None if owner == host else owner
    found: list[Source] = []
    if step in holdings.local.get(owner, set()):
        if owner == host:
            found.append(Source(Tier.LOCAL))
        elif owner in live:
            found.append(Source(Tier.PEER, owner, tagged))  # the twin serves its own local copy
    for holder in holdings.holders_of(owner):
        if (
            holder not in (host, owner)
            and holder in live
            and step in holdings.replicas[holder].get(owner, set())
        ):
            found.append(Source(Tier.PEER, holder, tagged))
    if step in holdings.persistent and owner in holdings.persistent_owners.get(step, {owner}):
        found.append(Source(Tier.PERSISTENT, None, tagged))
    return found


def _sources(
    holdings: Holdings, host: int, step: int, live: set[int], twins: Sequence[int]
) -> tuple[Source, ...]:
    if step in holdings.job_invalid:
        return ()
    found = _own_sources(holdings, host, step, live, host)
    for twin in twins:
        found += _own_sources(holdings, twin, step, live, host)
    return tuple(found)


def plan_restore(
    hosts: Iterable[int],
    holdings: Holdings,
    live: Iterable[int],
    twins: Mapping[int, Sequence[int]] | None = None,
) -> RestorePlan:
    """The newest step every host of `hosts` can restore, with each host's sources cheapest first.

    `live` are the hosts whose supervisors (and so their replicas) are reachable now; `twins` maps a
    rejoining host to the hosts whose shard equals its own (same worker, other slices).
    """
    twins = twins or {}
    hosts, alive = list(hosts), set(live)
    candidates = set(holdings.persistent)
    for steps in holdings.local.values():
        candidates |= steps
    for owners in holdings.replicas.values():
        for steps in owners.values():
            candidates |= steps
    for step in sorted(candidates, reverse=True):
        sources = {host: _sources(holdings, host, step, alive, twins.get(host, ())) for host in hosts}
        if all(sources.values()):
            return RestorePlan(step, sources)
    return RestorePlan(None, {host: () for host in hosts})
