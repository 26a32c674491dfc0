"""The job's geometry, in one vocabulary: slices of hosts of devices, which host is where, and the
names of its hosts.

A job has `slices` slices (data-parallel replicas over DCN) of `hosts_per_slice` hosts each, each host
with `devices_per_host` devices. Host h is worker h % hosts_per_slice of slice h // hosts_per_slice:
the global host index, which shard and checkpoint the host owns, fixed for the life of the job. The
operator's layout (`JobLayout`, below), the leader's world (supervisor.leader.world) and the policy's view of
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

    def relay_group_of(self, host: int, hosts_per_relay: int) -> int:
        """The relay group of `host`: groups are as many whole slices as make `hosts_per_relay` hosts
        (the last may have fewer), numbered from 0."""
        return self.slice_of(host) // -(-hosts_per_relay // self.hosts_per_slice)

    def relay_group(self, host: int, hosts_per_relay: int) -> tuple[int, ...]:
        """The hosts of `host`'s relay group, in order. The first is the group's relay; the others
        stand in, in turn, when it does not answer (supervisor.host.relay)."""
        slices = -(-hosts_per_relay // self.hosts_per_slice)
        first = self.relay_group_of(host, hosts_per_relay) * slices
        return self.hosts_in(range(first, min(self.slices, first + slices)))

    def lease_candidates(self, count: int) -> tuple[int, ...]:
        """The `count` hosts whose supervisors read and write the job's Lease when only a few do
        (spec.controlPlane.leaseCandidates): host 0 first (the job's first leader), then the first
        host of slices spread evenly over the job (different slices, different relay groups), then
        the slices' next hosts."""
        spread = max(1, self.slices // max(1, count))
        slices = [*range(0, self.slices, spread)]
        slices += [s for s in range(self.slices) if s not in set(slices)]
        order = [s * self.hosts_per_slice + w for w in range(self.hosts_per_slice) for s in slices]
        return tuple(order[: min(count, self.host_count)])

    def twins(self, host: int, slices: Iterable[int]) -> tuple[int, ...]:
        """Hosts of `slices` whose shard equals `host`'s: the same worker in the other slices."""
        worker, own = self.worker_of(host), self.slice_of(host)
        return tuple(s * self.hosts_per_slice + worker for s in slices if s != own)


@dataclass(frozen=True)
class HostId:
    """A host's place in the job. `index` is the JAX process id: slice * hosts_per_slice + worker."""

    index: int
    slice: int
    worker: int


@dataclass(frozen=True)
class JobLayout:
    """The job's hosts by name: `<job name>-s<slice>-w<worker>` (one mapping for the operator and the
    local runtime: slicekeeper.api's `cluster_layout` and `local_layout` make it)."""

    job_name: str
    shape: JobShape

    def host(self, index: int) -> HostId:
        count = self.shape.host_count
        if not 0 <= index < count:
            raise ValueError(f"host index {index} outside 0..{count - 1}")
        return HostId(index, self.shape.slice_of(index), self.shape.worker_of(index))

    def hostname(self, host: HostId) -> str:
        return f"{self.job_name}-s{host.slice}-w{host.worker}"

    def slice_hostnames(self, slice_index: int) -> list[str]:
        return [self.hostname(self.host(h)) for h in self.shape.hosts_of(slice_index)]


def host_ranges(hosts: Iterable[int]) -> str:
    """`hosts` in their order as runs of consecutive numbers: "0-7,16-23,8" (what a list of thousands
    of hosts costs on the wire: a world of 25,000 hosts in rank order is "0-24999")."""
    runs: list[list[int]] = []
    for host in hosts:
        if runs and host == runs[-1][1] + 1:
            runs[-1][1] = host
        else:
            runs.append([host, host])
    return ",".join(f"{first}-{last}" if last > first else str(first) for first, last in runs)


def parse_host_ranges(text: str) -> list[int]:
    """The hosts `host_ranges` wrote, in order; ValueError naming the part that is not a run."""
    hosts: list[int] = []
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        try:
            start, end = int(first), int(last or first)
        except ValueError:
            raise ValueError(f"{part!r} in {text[:80]!r} is not a host or a run of hosts (A-B)") from None
        if end < start or start < 0:
            raise ValueError(f"{part!r} in {text[:80]!r} is not a run of hosts (A-B, A <= B)")
        hosts.extend(range(start, end + 1))
    return hosts
