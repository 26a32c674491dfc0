"""Where each host of a job sits: its slice, its worker index, its names.

One mapping for the operator and the local runtime: the job's shape (slicekeeper.shape) under the
job's name. In local mode the job is scaled down to fit one
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
    """The job's hosts by name: `<job name>-s<slice>-w<worker>`."""

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


def cluster_layout(job: TrainingJob) -> JobLayout:
    """The job as its TPU slices have it (TrainingJob.shape)."""
    return JobLayout(job.metadata.name, job.shape)


def local_layout(job: TrainingJob) -> JobLayout:
    """The job scaled down to processes on one machine (see the module docstring)."""
    local = job.spec.local
    requested = local.hosts if local.hosts is not None else min(DEFAULT_LOCAL_HOSTS, job.shape.host_count)
    slices = min(job.spec.slices, requested)
    if local.hosts is not None and requested % slices:
        raise UserError(
            f"spec.local.hosts: {requested} hosts do not split evenly over {slices} slices "
            f"(spec.slices); use a multiple of {slices}"
        )
    return JobLayout(job.metadata.name, JobShape(slices, requested // slices, local.devices_per_host))
