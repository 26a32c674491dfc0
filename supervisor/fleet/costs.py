"""What each part of a recovery costs, as a function of the job's size, step time and shard size.

Every default names its source (docs/simulator.md has the table): this project's own measurements
where it has one (the control-plane benchmark, the recovery breakdown, the H200 program-cache run),
a published figure otherwise, and an assumption, said as such, where there is neither. Every field
can be set from the command line (`slicekeeper simulate --cost NAME=VALUE`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slicekeeper.errors import UserError

GB = 1e9


@dataclass(frozen=True)
class SizeCurve:
    """A cost that grows with the job's size: `base_seconds` plus `per_host_seconds` a host."""

    base_seconds: float
    per_host_seconds: float

    def at(self, host_count: int) -> float:
        return self.base_seconds + self.per_host_seconds * host_count


def fit_size_curve(points: Sequence[tuple[int, float]]) -> SizeCurve:
    """The least-squares line through (hosts, seconds) points, its base never negative (a line
    through the origin when the free fit's base is): what the control-plane benchmark measured at
    a few sizes, as the simulator prices any size. UserError with fewer than two sizes."""
    sizes = {hosts for hosts, _ in points}
    if len(sizes) < 2:
        raise UserError(f"a cost's line needs figures at two sizes at least, got {sorted(sizes)}")
    n = len(points)
    mean_x = sum(hosts for hosts, _ in points) / n
    mean_y = sum(seconds for _, seconds in points) / n
    spread = sum((hosts - mean_x) ** 2 for hosts, _ in points)
    slope = sum((hosts - mean_x) * (seconds - mean_y) for hosts, seconds in points) / spread
    base = mean_y - slope * mean_x
    if base < 0:
        through_origin = sum(hosts * seconds for hosts, seconds in points) / sum(h * h for h, _ in points)
        return SizeCurve(0.0, through_origin)
    return SizeCurve(base, slope)


@dataclass(frozen=True)
class CostModel:
    step_seconds: float = 10.0
    """The job's step time (`--step-seconds`)."""
    shard_gb: float = 4.0
    """Checkpoint bytes per host: a 70B-parameter model with Adam state (16 bytes a parameter) over
    256 hosts is 4.4 GB (assumption: set it to the job's own)."""
    crash_detect_seconds: float = 0.5
    """A workload's exit is seen by its supervisor at once; the leader hears of it in one round trip
    (0.03 s measured locally: docs/benchmarks.md, recovery); rounded up for a cluster's network."""
    hang_floor_seconds: float = 2.0
    """spec.health.hangTimeoutFloorSeconds: a hang is declared after max(floor, factor x step p95)."""
    hang_factor: float = 3.0
    """spec.health.hangTimeoutFactor."""
    lost_detect_seconds: float = 5.0
    """A machine gone without a word: the connection deadline (spec.health.connectionDeadlineSeconds)."""
    leader_lost_detect_seconds: float = 10.0
    """The leader's machine gone: its lease runs out and another supervisor takes it over (the
    cluster's lease timing, supervisor.leader.election.CLUSTER_TIMING: within about 10 s; 3.7 s
    measured locally, where the lease is 3 s)."""
    restart_round: SizeCurve = SizeCurve(0.0, 0.000182)
    """The leader's stop-and-start round: a line through the control-plane benchmark's documented
    medians, 0.16 s at 1,000 hosts, 0.80 at 5,000, 1.88 at 10,000 (docs/benchmarks.md, 66490ac),
    0.182 ms a host (`python -m benchmarks.control_plane_fit` fits it again from a run; the figures
    and the method are in docs/simulator.md). Set as `restart_round_base_seconds` and
    `restart_round_per_host_seconds`."""
    handover: SizeCurve = SizeCurve(0.0, 0.00099)
    """A new leader taking the job over, from its election to the last host registered again with
    it (each host reconnects, a TLS handshake, and registers with what it holds): a line through the
    same run's hand-overs less their kill-to-election part (0.5, 4.3 and 10.3 s at 1,000, 5,000 and
    10,000 hosts), 0.99 ms a host. It follows the leader's loss being noticed
    (`leader_lost_detect_seconds`) and comes before the restart round. Set as
    `handover_base_seconds` and `handover_per_host_seconds`."""
    distributed_init_seconds: float = 10.0
    """jax.distributed.initialize and the megascale mesh at thousands of hosts (assumption: no
    published figure; 0.5 s measured with four local processes)."""
    prep_seconds: float = 0.0
    """The workload's own set-up before its restore (data pipeline, model built): 0.03-0.15 s for
    the example loop (a replay measures it); a job's own figure otherwise (assumption: overlapped)."""
    program_load_seconds: float = 2.0
    """Compiled programs loaded from the program cache: 1.7-2.1 s on an H200 (issue 29's measurement)."""
    program_compile_seconds: float = 15.2
    """Compiled afresh (a world that never ran: a scale-down): 15.2 s on the same H200 run."""
    local_gb_per_second: float = 5.0
    """Reading and verifying a shard from the host's own RAM disk (assumption)."""
    peer_gb_per_second: float = 1.25
    """Fetching a shard from a peer over a 10 Gb/s data-center network (assumption: the DCN link)."""
    persistent_gb_per_second: float = 0.25
    """Reading a shard from an object store, per host (assumption: GCS per-VM reads of a few hundred MB/s)."""
    snapshot_gb_per_second: float = 10.0
    """The blocking part of a local save, a copy of the shard in memory (assumption); the write
    runs in the background (docs/workload-sdk.md)."""
    replacement_seconds: float = 300.0
    """A new machine for a lost one (a node provisioned and its pod started): GKE TPU node creation
    takes minutes (assumption); also the time a spare takes to come back to the pool."""
    recreate_pods_seconds: float = 130.0
    """Recreating every pod of the job (the restart-from-persistent baseline): JobSet measured 2 min 10 s
    at 5,000 nodes (REFERENCES.md)."""

    def hang_detect(self) -> float:
        return max(self.hang_floor_seconds, self.hang_factor * self.step_seconds)

    def restore(self, gb_per_second: float) -> float:
        return self.shard_gb / gb_per_second

    def snapshot(self) -> float:
        return self.shard_gb / self.snapshot_gb_per_second


CURVE_PARTS = ("base_seconds", "per_host_seconds")
"""The settings of a cost that is a line in the job's size: `<cost>_base_seconds` and
`<cost>_per_host_seconds`."""


def setting_names() -> list[str]:
    """Every `--cost` NAME: each plain field, and each line's two parts."""
    names = []
    for field in dataclasses.fields(CostModel):
        if isinstance(field.default, SizeCurve):
            names += [f"{field.name}_{part}" for part in CURVE_PARTS]
        else:
            names.append(field.name)
    return sorted(names)


def with_settings(model: CostModel, settings: list[str]) -> CostModel:
    """`model` with `NAME=VALUE` settings applied; UserError naming a setting that is not a field."""
    names = setting_names()
    changes: dict[str, float] = {}
    for setting in settings:
        name, eq, value = setting.partition("=")
        if not eq or name not in names:
            raise UserError(f"--cost {setting!r}: expected NAME=VALUE with NAME one of {', '.join(names)}")
        try:
            changes[name] = float(value)
        except ValueError:
            raise UserError(f"--cost {setting!r}: {value!r} is not a number") from None
        if changes[name] < 0:
            raise UserError(f"--cost {setting!r}: must not be negative")
    plain: dict[str, Any] = {}
    for field in dataclasses.fields(CostModel):
        if isinstance(field.default, SizeCurve):
            named = {part: f"{field.name}_{part}" for part in CURVE_PARTS}
            parts = {part: changes[name] for part, name in named.items() if name in changes}
            if parts:
                plain[field.name] = dataclasses.replace(getattr(model, field.name), **parts)
        elif field.name in changes:
            plain[field.name] = changes[field.name]
    return dataclasses.replace(model, **plain)
