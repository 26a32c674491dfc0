"""`slicekeeper operator`: run the kopf operator (handlers in operator/handlers.py) in this process.

Standalone (no kopf peering): one replica, or several with `--leader-election` of which only the
holder of the operator's Lease acts (operator/leader_election.py). It serves every namespace
unless `--namespace` is given, with kopf's liveness endpoint for the Deployment's probe and the
operator's Prometheus metrics (operator/metrics.py) on `--metrics-port`. The API server is found in
the pod's service account, else in the kubeconfig; `--server` overrides both (tests, emulators).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path

import kopf
from slicekeeper.operator.cluster import Cluster, client_configuration
from slicekeeper.operator.creation import DEFAULT_CONCURRENCY
from slicekeeper.operator.handlers import STATUS_INTERVAL_SECONDS, register
from slicekeeper.operator.leader_election import (
    DEFAULT_LEASE_SECONDS,
    OperatorLease,
    standby_liveness,
    timing,
)
from slicekeeper.operator.log_summary import quiet_routine
from slicekeeper.operator.metrics import METRICS_PORT, OperatorMetrics

from slicekeeper.api_rules import DEFAULT_BURST, DEFAULT_QPS, TokenBucket
from slicekeeper.errors import UserError

LIVENESS = "http://0.0.0.0:8080/healthz"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
logger = logging.getLogger(__name__)


def run(
    namespaces: list[str],
    server: str | None = None,
    liveness: str | None = LIVENESS,
    metrics_port: int = METRICS_PORT,
    *,
    log_level: str = "info",
    api_qps: float | None = None,
    api_burst: int | None = None,
    create_concurrency: int | None = None,
    leader_election: bool = False,
    lease_namespace: str | None = None,
    lease_seconds: int = DEFAULT_LEASE_SECONDS,
    status_interval: float = STATUS_INTERVAL_SECONDS,
) -> int:
    """Run until stopped; `metrics_port` 0 serves the metrics on a free port (logged). The API limits
    (None: their defaults): slicekeeper/api_rules.py and operator/creation.py. `leader_election`: act
    only while holding the operator's Lease in `lease_namespace` (operator/leader_election.py); exit
    1 once it is lost."""
    qps, burst = DEFAULT_QPS if api_qps is None else api_qps, api_burst or DEFAULT_BURST
    if qps < 0:
        raise UserError(f"--api-qps {qps}: must not be negative (0: no limit)")
    if not status_interval > 0:
        raise UserError(f"--status-interval {status_interval}: must be a positive number of seconds")
    try:
        timing(lease_seconds)
    except ValueError as error:
        raise UserError(f"--leader-election-lease-seconds: {error}") from None
    level = getattr(logging, log_level.upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_routine(level)  # kopf's line per pod event: DEBUG (operator/log_summary.py)
    registry = kopf.OperatorRegistry()
    if server is not None:

        @kopf.on.login(registry=registry)
        def login(**_: object) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=server, insecure=True)

    else:
        kopf.on.login(registry=registry)(kopf.login_via_client)
    metrics = OperatorMetrics()
    cluster = Cluster(
        client_configuration(server),
        metrics=metrics,
        limiter=TokenBucket(qps, burst),
        concurrency=create_concurrency or DEFAULT_CONCURRENCY,
    )
    register(registry, cluster, status_interval=status_interval, namespaces=namespaces)
    try:
        port = metrics.serve(metrics_port)
    except OSError as error:  # in use, or not ours to bind
        raise UserError(f"--metrics-port {metrics_port}: {error}") from None
    logger.info("serving the operator's metrics on port %d (/metrics)", port)
    lease = None
    if leader_election:
        lease = OperatorLease(cluster.configuration, lease_namespace or _own_namespace(), lease_seconds)
        with standby_liveness(liveness):
            lease.wait_to_lead()
    lost = threading.Event()

    async def operate() -> None:
        # An asyncio flag, set from the renewing thread: kopf waits for a threading one in a thread
        # of the loop's executor, which would then never end, and neither would the process.
        stop = asyncio.Event()
        if lease is not None:
            loop = asyncio.get_running_loop()

            def stop_acting() -> None:
                lost.set()
                loop.call_soon_threadsafe(stop.set)

            lease.keep_leading(stop_acting)

        @kopf.on.cleanup(registry=registry)
        async def stopped(**_: object) -> None:
            # Stopped by a signal, kopf still waits for its task watching this flag, then 5 s more
            # for that task as a hung one, before the process exits.
            stop.set()

        await kopf.operator(
            registry=registry,
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=liveness,
            stop_flag=stop,
        )

    asyncio.run(operate())
    if lost.is_set():  # exit 1: the Deployment starts it again, as a standby
        logger.error("lost the operator's Lease: another replica may act now; exiting to stand by")
        return 1
    return 0


def _own_namespace() -> str:
    """The namespace of the operator's pod (the service account's), else `default`."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return os.environ.get("POD_NAMESPACE") or "default"
