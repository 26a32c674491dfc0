"""Which slices take part in the job now: elastic scale-down and back up by whole slices.

Slices are the job's data-parallel replicas (multislice over DCN), so the job can go on without one:
it drops the slice, the surviving hosts restart on a smaller mesh, and later the slice comes back.
A host's identity (which shard it owns) never changes; its rank in a generation (the JAX process id)
is its position among the hosts taking part. Hosts of a dropped slice whose machines are still alive
are idle ("parked"); they, or spares standing in for their lost machines, bring the slice back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from slicekeeper import policy
from slicekeeper.shape import JobShape


@dataclass
class JobWorld:
    shape: JobShape
    """The full job (slicekeeper.shape)."""
    min_slices: int = 1
    active: list[int] = field(default_factory=list)
    """Slices taking part, in order."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """World size over time: {t, step, generation, slices, hosts}."""
    _cache: tuple[list[int], int, tuple[int, ...], frozenset[int]] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    """`active` as last seen (the list and its length), its hosts in rank order and as a set."""

    def __post_init__(self) -> None:
        if not self.active:
            self.active = list(range(self.shape.slices))
        self.min_slices = max(1, min(self.min_slices, self.shape.slices))

    @property
    def full_hosts(self) -> int:
        return self.shape.host_count

    @property
    def hosts(self) -> tuple[int, ...]:
        """Hosts taking part, in rank order (made once per change of the slices taking part: at
        25,000 hosts the leader asks for them at every member's message of a restart)."""
        return self._taking_part()[0]

    def takes_part(self, host: int) -> bool:
        """Whether `host` is one of `hosts` (without a look at each)."""
        return host in self._taking_part()[1]

    def _taking_part(self) -> tuple[tuple[int, ...], frozenset[int]]:
        active, cached = self.active, self._cache
        if cached is None or cached[0] is not active or cached[1] != len(active):
            hosts = self.shape.hosts_in(active)
            cached = self._cache = (active, len(active), hosts, frozenset(hosts))
        return cached[2], cached[3]

    @property
    def dropped(self) -> list[int]:
        return [s for s in range(self.shape.slices) if s not in self.active]

    @property
    def scaled_down(self) -> bool:
        return len(self.active) < self.shape.slices

    def hosts_of(self, slice_index: int) -> tuple[int, ...]:
        return self.shape.hosts_of(slice_index)

    def slice_of(self, host: int) -> int:
        return self.shape.slice_of(host)

    def rank(self, host: int) -> int:
        return self.hosts.index(host)

    def twins(self, host: int) -> tuple[int, ...]:
        """Active hosts whose shard equals `host`'s: the same worker in the other active slices."""
        return self.shape.twins(host, self.active)

    def drop(self, slices: list[int]) -> None:
        remaining = [s for s in self.active if s not in slices]
        if len(remaining) < self.min_slices:
            raise ValueError(
                f"dropping slice(s) {slices} would leave {len(remaining)} of {self.shape.slices}, "
                f"below spec.minSlices={self.min_slices}"
            )
        self.active = remaining

    def restore(self, slices: list[int]) -> None:
        self.active = sorted({*self.active, *slices})

    def state(self) -> dict[str, Any]:
        """What changes as the job runs (the slices taking part, the history), as JSON."""
        return {"active": list(self.active), "history": [dict(entry) for entry in self.history]}

    def carry_on(self, state: dict[str, Any]) -> None:
        self.active = [int(s) for s in state["active"]]
        self.history = [dict(entry) for entry in state["history"]]

    def record(self, step: int, generation: int) -> None:
        """Note the world of a generation that starts (only when it changed)."""
        if self.history and self.history[-1]["slices"] == self.active:
            return
        self.history.append(
            {
                "t": time.time(),
                "step": step,
                "generation": generation,
                "slices": list(self.active),
                "hosts": len(self.hosts),
            }
        )

    def restorable(self, idle: set[int], spares: int) -> list[int]:
        """Dropped slices that could come back now: each host idle-but-alive or covered by a spare."""
        back = []
        for slice_index in self.dropped:
            needed = sum(1 for h in self.hosts_of(slice_index) if h not in idle)
            if needed <= spares:
                spares -= needed
                back.append(slice_index)
        return back

    def for_policy(self, idle: set[int], spares: int) -> policy.World:
        return policy.World(
            active_slices=tuple(self.active),
            full_slices=self.shape.slices,
            min_slices=self.min_slices,
            hosts_per_slice=self.shape.hosts_per_slice,
            devices_per_host=self.shape.devices_per_host,
            idle_hosts=tuple(sorted(idle)),
            restorable_slices=len(self.restorable(idle, spares)),
        )
