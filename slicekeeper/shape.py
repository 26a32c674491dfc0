"""The job's shape, in one vocabulary: slices of hosts of devices, and which host is where.

A job has `slices` slices (data-parallel replicas over DCN) of `hosts_per_slice` hosts each, each host
with `devices_per_host` devices. Host h is worker h % hosts_per_slice of slice h // hosts_per_slice:
the global host index, which shard and checkpoint the host owns, fixed for the life of the job. The
operator's layout (slicekeeper.topology), the leader's world (supervisor.world) and the policy's view of
it (slicekeeper.policy.World) all say it with this one type. Hosts as a collection are a tuple in rank
order; a number of hosts is a count (`host_count`).

Standard library only: user policies import it through slicekeeper.policy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class JobShape:
    slices: int
    hosts_per_slice: int
    devices_per_host: int = 1

    def __post_init__(self) -> None:
        if self.slices < 1 or self.hosts_per_slice < 1 or self.devices_per_host < 1:
            raise ValueError(f"a job has at least one slice, host per slice and device per host, not {self}")

    @property
    def host_count(self) -> int:
        """Hosts of the full job."""
        return self.slices * self.hosts_per_slice

    def slice_of(self, host: int) -> int:
        return host // self.hosts_per_slice

    def worker_of(self, host: int) -> int:
        return host % self.hosts_per_slice

    def hosts_of(self, slice_index: int) -> tuple[int, ...]:
        first = slice_index * self.hosts_per_slice
        return tuple(range(first, first + self.hosts_per_slice))

    def hosts_in(self, slices: Iterable[int]) -> tuple[int, ...]:
        """The hosts of `slices`, in rank order (slice by slice)."""
        return tuple(h for s in slices for h in self.hosts_of(s))

    def twins(self, host: int, slices: Iterable[int]) -> tuple[int, ...]:
        """Hosts of `slices` whose shard equals `host`'s: the same worker in the other slices."""
        worker, own = self.worker_of(host), self.slice_of(host)
        return tuple(s * self.hosts_per_slice + worker for s in slices if s != own)
