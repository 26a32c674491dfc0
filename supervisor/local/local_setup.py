"""What a local run is, decided and checked once before any process starts.

`slicekeeper run` (supervisor.local.local_runtime) checks what it is given at its edge: the chaos faults
against the job's hosts (and, for a partition, that nftables can cut a machine off), the steps, that
the work, checkpoint and report folders are writable, that the persistent tier answers. What it
decided is one frozen `RunSetup`, which the run's parts share (the machines' keepers, the live
status watch), and from which the plan every supervisor reads is made.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTier, PersistentTierError
from slicekeeper.supervisor.host import partition
from slicekeeper.supervisor.plan import JobPlan
from slicekeeper.supervisor.ports import free_port

from slicekeeper.api import TrainingJob
from slicekeeper.chaos import ChaosKind, Fault, check_hosts, parse_chaos
from slicekeeper.errors import UserError
from slicekeeper.shape import JobLayout

DEFAULT_CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "slicekeeper" / "jax-compilation-cache"
)
CREDENTIALS_DIR = "credentials"
"""In the run directory: this run's own CA and certificate (slicekeeper.credentials), its user's only."""


def _check_writable(path: Path, what: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".slicekeeper-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise UserError(f"{what}: '{path}' is not writable: {error.strerror or error}") from None


@dataclass(frozen=True, kw_only=True)
class RunSetup:
    """What a local run is: its job and layout, its chaos and steps, where it writes (checked)."""

    job: TrainingJob
    layout: JobLayout
    """The job scaled down to this machine (slicekeeper.api.local_layout)."""
    faults: tuple[Fault, ...]
    """The chaos faults (slicekeeper.chaos), checked against the job's hosts."""
    total_steps: int
    run_dir: Path
    """The plan, the machines' folders (logs, reports), the job's summary and event log."""
    checkpoint_root: Path
    """This run's folder under spec.checkpoint.localDir: the machines' disks, removed at the end."""
    report_path: Path
    run_key: str
    """The run's name in the persistent tier: the job's and its run directory's."""
    partitions: bool
    """Chaos `partition` among the faults: each machine runs under a group id of its own
    (supervisor.host.partition)."""

    @classmethod
    def prepare(
        cls,
        job: TrainingJob,
        layout: JobLayout,
        *,
        steps: int | None,
        chaos: str | None,
        report_path: Path | None,
    ) -> RunSetup:
        """The run of `job` laid out as `layout`: `steps` (None: the job's), `chaos` (a chaos spec),
        `report_path` (None: report.json in the run directory), each checked; its folders made.
        UserError naming the option or field at fault."""
        faults = parse_chaos(chaos)
        check_hosts(faults, layout.shape.host_count)
        partitions = any(f.kind is ChaosKind.PARTITION for f in faults)
        if partitions:
            partition.check_available()
        total_steps = steps if steps is not None else job.spec.workload.steps
        if total_steps < 1:
            raise UserError("--steps: must be at least 1")
        work_dir = job.spec.local.work_dir
        if work_dir:
            run_dir = Path(work_dir) / f"{job.metadata.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            _check_writable(run_dir, "spec.local.workDir")
        else:
            run_dir = Path(tempfile.mkdtemp(prefix=f"slicekeeper-{job.metadata.name}-"))
        checkpoint_root = Path(job.spec.checkpoint.local_dir) / run_dir.name
        _check_writable(checkpoint_root, "spec.checkpoint.localDir")
        report_path = report_path or run_dir / "report.json"
        _check_writable(report_path.parent, "--report")
        run_key = f"{job.metadata.name}/{run_dir.name}"
        persistent = job.spec.checkpoint.persistent
        if persistent is not None:
            # Reported now, not at the first save minutes into the run.
            try:
                PersistentTier(persistent.uri, run_key).probe()
            except PersistentTierError as error:
                raise UserError(f"spec.checkpoint.persistent.uri: {error}") from None
        return cls(
            job=job,
            layout=layout,
            faults=tuple(faults),
            total_steps=total_steps,
            run_dir=run_dir,
            checkpoint_root=checkpoint_root,
            report_path=report_path,
            run_key=run_key,
            partitions=partitions,
        )

    @property
    def spares(self) -> int:
        """Spare machines the run starts with (spec.local.spares)."""
        return self.job.spec.local.spares

    def plan(self) -> JobPlan:
        """The plan every supervisor of the run reads, its first leader's address a free port now."""
        return JobPlan(
            training_job=self.job,
            layout=self.layout,
            run_dir=str(self.run_dir),
            leader=f"127.0.0.1:{free_port()}",
            total_steps=self.total_steps,
            checkpoint_root=str(self.checkpoint_root),
            compilation_cache=os.environ.get("SLICEKEEPER_COMPILATION_CACHE", str(DEFAULT_CACHE)),
            local=True,
            chaos=[str(f) for f in self.faults],
            metrics_port=self.job.spec.local.metrics_port,
            spares=self.spares,
            run_key=self.run_key,
            relay_ports=[free_port() for _ in range(self.layout.shape.host_count)]
            if self.job.spec.control_plane.relays
            else [],
            credentials=str(self.run_dir / CREDENTIALS_DIR),
        )
