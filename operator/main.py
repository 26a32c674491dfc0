"""`slicekeeper operator`: run the kopf operator (handlers in operator/handlers.py) in this process.

One replica, standalone (no kopf peering), serving every namespace unless `--namespace` is given,
with kopf's liveness endpoint for the Deployment's probe. The API server is found in the pod's
service account, else in the kubeconfig; `--server` overrides both (tests, emulators).
"""

from __future__ import annotations

import asyncio
import logging

import kopf
from slicekeeper.operator.cluster import Cluster, client_configuration
from slicekeeper.operator.handlers import register

LIVENESS = "http://0.0.0.0:8080/healthz"


def run(
    namespaces: list[str],
    server: str | None = None,
    liveness: str | None = LIVENESS,
    *,
    log_level: str = "info",
) -> int:
    level = getattr(logging, log_level.upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    registry = kopf.OperatorRegistry()
    if server is not None:

        @kopf.on.login(registry=registry)
        def login(**_: object) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=server, insecure=True)

    else:
        kopf.on.login(registry=registry)(kopf.login_via_client)
    register(registry, Cluster(client_configuration(server)))
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
