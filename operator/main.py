"""`slicekeeper operator`: run the kopf operator (handlers in operator/handlers.py) in this process.

One replica, standalone (no kopf peering), serving every namespace unless `--namespace` is given,
with kopf's liveness endpoint for the Deployment's probe and the operator's Prometheus metrics
(operator/metrics.py) on `--metrics-port`. The API server is found in the pod's service account, else
in the kubeconfig; `--server` overrides both (tests, emulators).
"""

from __future__ import annotations

import asyncio
import logging

import kopf
from slicekeeper.operator.cluster import Cluster, client_configuration
from slicekeeper.operator.creation import DEFAULT_CONCURRENCY
from slicekeeper.operator.handlers import register
from slicekeeper.operator.log_summary import quiet_routine
from slicekeeper.operator.metrics import METRICS_PORT, OperatorMetrics
from slicekeeper.operator.rate_limit import DEFAULT_BURST, DEFAULT_QPS, TokenBucket

from slicekeeper.errors import UserError

LIVENESS = "http://0.0.0.0:8080/healthz"
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
) -> int:
    """Run until stopped; `metrics_port` 0 serves the metrics on a free port (logged). The API limits
    (None: their defaults): operator/rate_limit.py and operator/creation.py."""
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
    qps, burst = DEFAULT_QPS if api_qps is None else api_qps, api_burst or DEFAULT_BURST
    if qps < 0:
        raise UserError(f"--api-qps {qps}: must not be negative (0: no limit)")
    cluster = Cluster(
        client_configuration(server),
        metrics=metrics,
        limiter=TokenBucket(qps, burst),
        concurrency=create_concurrency or DEFAULT_CONCURRENCY,
    )
    register(registry, cluster)
    try:
        port = metrics.serve(metrics_port)
    except OSError as error:  # in use, or not ours to bind
        raise UserError(f"--metrics-port {metrics_port}: {error}") from None
    logger.info("serving the operator's metrics on port %d (/metrics)", port)
    asyncio.run(
        kopf.operator(
            registry=registry,
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=liveness,
        )
    )
    return 0
