"""Where each host of a job sits: its slice, its worker index, its names.

One mapping for the operator and the local runtime. In local mode the job is scaled down to fit one
machine: `spec.local.hosts` host processes (default min(4, hosts of the real job)), each faking
`spec.local.devicesPerHost` CPU devices. The slice count is kept when the hosts allow it (every
slice keeps at least one host); hosts are split evenly over slices.
"""

from __future__ import annotations

from dataclasses import dataclass

from slicekeeper.api import TrainingJob
from slicekeeper.errors import UserError
from slicekeeper.shape import JobShape

DEFAULT_LOCAL_HOSTS = 4


@dataclass(frozen=True)
class HostId:
    """A host's place in the job. `index` is the JAX process id: slice * hosts_per_slice + worker."""

    index: int
    slice: int
    worker: int


@dataclass(frozen=True)
class JobLayout:
    job_name: str
    slices: int
    hosts_per_slice: int
    devices_per_host: int

    @property
    def shape(self) -> JobShape:
        return JobShape(self.slices, self.hosts_per_slice, self.devices_per_host)

    @property
    def hosts(self) -> int:
        """How many hosts the job has (a count: see slicekeeper.shape)."""
        return self.shape.host_count

    def host(self, index: int) -> HostId:
        if not 0 <= index < self.hosts:
            raise ValueError(f"host index {index} outside 0..{self.hosts - 1}")
        return HostId(index, self.shape.slice_of(index), self.shape.worker_of(index))

    def hostname(self, host: HostId) -> str:
        return f"{self.job_name}-s{host.slice}-w{host.worker}"

    def slice_hostnames(self, slice_index: int) -> list[str]:
        return [self.hostname(self.host(h)) for h in self.shape.hosts_of(slice_index)]


def cluster_layout(job: TrainingJob) -> JobLayout:
    shape = job.slice_shape
    return JobLayout(job.metadata.name, job.spec.slices, shape.hosts, shape.chips_per_host)


def local_layout(job: TrainingJob) -> JobLayout:
    """The job scaled down to processes on one machine (see the module docstring)."""
    local = job.spec.local
    real_hosts = job.total_hosts
    requested = local.hosts if local.hosts is not None else min(DEFAULT_LOCAL_HOSTS, real_hosts)
    slices = min(job.spec.slices, requested)
    if local.hosts is not None and requested % slices:
        raise UserError(
            f"spec.local.hosts: {requested} hosts do not split evenly over {slices} slices "
            f"(spec.slices); use a multiple of {slices}"
        )
    return JobLayout(job.metadata.name, slices, requested // slices, local.devices_per_host)
