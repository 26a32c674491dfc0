"""Prometheus metrics of one host's supervisor, read from its accountant at scrape time.

Counters derived from the goodput accountant are produced by a custom collector (so they are
exactly the accountant's figures, never a second bookkeeping); the rest are plain instruments on a
registry of the supervisor's own (tests get a fresh one each). The goodput counters show the
accountant's settled seconds: an interval still open (a step under way) is counted once it closes,
since a fault may yet book it as recovery, and a counter must never go down.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from slicekeeper.supervisor.checkpoint_vocabulary import StoreReads, Tier

from slicekeeper.goodput import BADPUT, Category, GoodputAccountant

STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class _GoodputCollector(Collector):
    def __init__(self, accountant: Callable[[], GoodputAccountant]) -> None:
        self._accountant = accountant

    def collect(self) -> Iterator[Metric]:
        accountant = self._accountant()
        now = time.time()
        seconds = accountant.settled_seconds(now)
        productive = CounterMetricFamily(
            "slicekeeper_productive_seconds", "Wall seconds spent in productive training steps."
        )
        productive.add_metric([], seconds[Category.PRODUCTIVE])
        yield productive
        badput = CounterMetricFamily(
            "slicekeeper_badput_seconds", "Wall seconds lost, by badput category.", labels=["category"]
        )
        for category in BADPUT:
            badput.add_metric([category.value], seconds[category])
        yield badput
        goodput = GaugeMetricFamily("slicekeeper_goodput_ratio", "Productive seconds / wall seconds.")
        goodput.add_metric([], accountant.goodput(now))
        yield goodput


@dataclass(frozen=True)
class Role:
    """Which machine a supervisor is, and which host of the job it plays (host None: a waiting spare)."""

    machine: str
    host: int | None
    slice: int | None = None
    worker: int | None = None


class _RoleCollector(Collector):
    """`slicekeeper_host_info`, the series the others are joined with to be grouped by host: a
    spare's series belong to the host it took over from then on (the machine, the scrape target,
    stays the same)."""

    def __init__(self, role: Callable[[], Role]) -> None:
        self._role = role

    def collect(self) -> Iterator[Metric]:
        role = self._role()
        info = GaugeMetricFamily(
            "slicekeeper_host_info",
            "1, labelled with the machine and the host (slice, worker) of the job it plays now; "
            "role `spare` and no host while it waits.",
            labels=["machine", "role", "host", "slice", "worker"],
        )
        played = [role.host, role.slice, role.worker]
        labels = ["" if value is None else str(value) for value in played]
        info.add_metric([role.machine, "spare" if role.host is None else "host", *labels], 1.0)
        yield info


class _StoreReadsCollector(Collector):
    """The persistent tier's own read counts (checkpoint_vocabulary.StoreReads), at scrape time."""

    def __init__(self, reads: StoreReads) -> None:
        self._reads = reads

    def collect(self) -> Iterator[Metric]:
        shards = CounterMetricFamily(
            "slicekeeper_persistent_shard_reads", "Host shards downloaded from the persistent tier."
        )
        shards.add_metric([], self._reads.shards)
        yield shards
        read = CounterMetricFamily(
            "slicekeeper_persistent_read_bytes",
            "Bytes read from the persistent tier (shards, manifests, markers).",
        )
        read.add_metric([], self._reads.bytes)
        yield read


class SupervisorMetrics:
    def __init__(
        self, accountant: Callable[[], GoodputAccountant], registry: CollectorRegistry | None = None
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.registry.register(_GoodputCollector(accountant))
        self.step_duration = Histogram(
            "slicekeeper_step_duration_seconds",
            "Training step time.",
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.steps = Counter(
            "slicekeeper_steps", "Training steps completed (re-executed ones too).", registry=self.registry
        )
        self.step = Gauge("slicekeeper_step", "Last completed training step.", registry=self.registry)
        self.restarts = Counter(
            "slicekeeper_restarts",
            "Workload restarts, by the kind of fault that caused them.",
            ["kind"],
            registry=self.registry,
        )
        self.faults = Counter(
            "slicekeeper_host_faults",
            "Faults the leader attributed to this host, by kind (a hang to the host that stopped, "
            "not to the one whose timer noticed).",
            ["kind"],
            registry=self.registry,
        )
        self.last_checkpoint_step = Gauge(
            "slicekeeper_last_checkpoint_step",
            "Newest committed local checkpoint step.",
            registry=self.registry,
        )
        self.checkpoint_failures = Counter(
            "slicekeeper_checkpoint_failures",
            "Checkpoint saves that failed.",
            ["tier"],
            registry=self.registry,
        )
        self.checkpoint_transfer = Histogram(
            "slicekeeper_checkpoint_transfer_seconds",
            "Time to copy one host's shard of a step: to a peer or the persistent tier (save), or back "
            "into the local tier (restore).",
            ["tier", "direction"],
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.restores = Counter(
            "slicekeeper_restores",
            "Restores of this host's shard, by the tier it came from.",
            ["tier"],
            registry=self.registry,
        )
        self.hang_timeout = Gauge(
            "slicekeeper_hang_timeout_seconds", "Current hang allowance.", registry=self.registry
        )
        self.generation = Gauge(
            "slicekeeper_restart_generation", "Restart generation.", registry=self.registry
        )
        self.refused_connections = Counter(
            "slicekeeper_refused_connections",
            "Connections to this supervisor's servers refused for want of the job's credentials, by "
            "port (leader, peer).",
            ["port"],
            registry=self.registry,
        )
        for port in ("leader", "peer"):  # at 0 from the start: a rate or an alert sees the first one
            self.refused_connections.labels(port=port)
        for tier in Tier:  # the same: a dashboard's failures and restores by tier from the start
            self.checkpoint_failures.labels(tier=tier.value)
            self.restores.labels(tier=tier.value)

    def refused(self, port: str) -> None:
        """A connection to this supervisor's `port` ("leader", "peer") was refused (supervisor.tls)."""
        self.refused_connections.labels(port=port).inc()

    def export_role(self, role: Callable[[], Role]) -> None:
        """Export `slicekeeper_host_info` for the role `role()` gives when scraped."""
        self.registry.register(_RoleCollector(role))

    def export(self, collector: Collector) -> None:
        """Export another part's series, read when scraped (e.g. the job's, while leading)."""
        self.registry.register(collector)

    def count_store_reads(self, reads: StoreReads) -> None:
        """Export what the persistent tier counts as it reads (a job with that tier)."""
        self.registry.register(_StoreReadsCollector(reads))

    def serve(self, port: int, address: str = "127.0.0.1") -> int:
        """Serve /metrics; returns the bound port (0 picks a free one)."""
        try:
            server, _thread = start_http_server(port, addr=address, registry=self.registry)
        except OSError as error:
            raise OSError(
                error.errno,
                f"cannot serve metrics on {address}:{port} (spec.local.metricsPort or the "
                f"pod's metrics port): {error.strerror}",
            ) from error
        return int(server.server_port)
