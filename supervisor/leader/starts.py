"""What a generation's start tells each host, made so that a start of 25,000 hosts costs no more per
host than a start of four.

Every host gets the same world (the hosts taking part, in rank order), written once as runs of
hosts ("0-24999"), its rank, where to stage its restore from, the addresses of the hosts that keep
its own replicas (not every host's: that would cost the square of the job's size) and how often to
report its progress (`PROGRESS_REPORTS_PER_STEP`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoints.peer_tier import replica_holders
from slicekeeper.supervisor.checkpoints.restore_plan import RestorePlan

from slicekeeper.shape import JobShape, host_ranges

PROGRESS_REPORTS_PER_STEP = 2500
"""Progress reports the leader asks for per step of the job, at most: a larger world's hosts each
report every few steps (`messages.Start.progress_every`), with the steps in between; up to 2,500
hosts report every step, as ever."""


@dataclass(frozen=True)
class Starts:
    """A generation's start for every host of its world, as what every start shares (`common`) and
    what is each host's own (`each`: its rank, its restore sources, its replica holders): written as
    such to a relay, which makes each member's line (supervisor.relay_frames, a bundle), so that the
    leader encodes the world once, not once a host."""

    common: dict[str, Any]
    """The fields every host's start shares, as JSON (its term is stamped when sent)."""
    each: dict[int, dict[str, Any]]
    """host -> the fields its own, as JSON."""

    def message(self, host: int) -> messages.Start:
        """`host`'s start, whole (as its supervisor reads it)."""
        return messages.Start.model_validate(self.common | self.each[host])


@dataclass(frozen=True)
class StartMessages:
    shape: JobShape
    coordinator_address: Callable[[int, int], str]
    """(generation, the host of rank 0) -> the address of the workloads' distributed coordinator."""
    peer_replicas: int | None = None
    """Hosts that keep each host's replicas (None: each host is told every host's address)."""

    def for_world(
        self,
        generation: int,
        world: Sequence[int],
        restore_step: int | None,
        plan: RestorePlan,
        addresses: dict[int, str],
    ) -> Starts:
        """Each host of `world`'s start of `generation` (`addresses`: every host's replica address)."""
        in_world = frozenset(world)
        shared = messages.Start(
            generation=generation,
            coordinator=self.coordinator_address(generation, world[0]),
            restore_step=restore_step,
            world=host_ranges(world),
            rank=0,
            progress_every=max(1, -(-len(world) // PROGRESS_REPORTS_PER_STEP)),
        ).model_dump(mode="json", exclude={"term", *OWN})
        everyone = {str(host): address for host, address in addresses.items()}
        return Starts(
            shared,
            {
                host: {
                    "rank": rank,
                    "sources": [dict(source.to_message(addresses)) for source in plan.sources.get(host, ())],
                    "replica_addresses": self._holders(host, addresses, in_world, everyone),
                }
                for rank, host in enumerate(world)
            },
        )

    def _holders(
        self, host: int, addresses: dict[int, str], world: frozenset[int], everyone: dict[str, str]
    ) -> dict[str, str]:
        if self.peer_replicas is None:
            return everyone
        shape = self.shape
        holders = replica_holders(host, shape.host_count, shape.hosts_per_slice, self.peer_replicas, world)
        return {str(holder): addresses[holder] for holder in holders if holder in addresses}


OWN = frozenset({"rank", "sources", "replica_addresses"})
"""The fields of a start that are each host's own."""
