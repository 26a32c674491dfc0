"""Operator replicas, one acting at a time: leader election on a Lease.

kopf runs standalone (no peering), so two operators acting at once would both create a job's pods
and both replace a failed one. With `--leader-election`, a replica first takes the Lease
`slicekeeper-operator` in its own namespace, with Kubernetes' own algorithm (`kubernetes.
leaderelection`, client-go's: a candidate takes over a record it has seen unrenewed for the lease's
duration), and only then starts kopf. While it waits (a standby) it serves its liveness endpoint
itself, so the kubelet keeps it. The holder renews the Lease from a thread; once it cannot renew
within the deadline it stops kopf and the process ends with an error, to come back as a standby:
it can no longer be sure that nobody else acts (client-go's controllers exit the same way).

A replica killed (its node gone, SIGKILL) is replaced within the lease's duration (default 15 s):
the standby takes over and resumes every job, as a restarted operator does. The library cannot give
a lease up (a candidate then waits a whole duration anyway), so a graceful stop hands over in the
same time.
"""

from __future__ import annotations

import contextlib
import http.server
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import kubernetes
from kubernetes.leaderelection.electionconfig import Config
from kubernetes.leaderelection.leaderelection import LeaderElection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

LEASE_NAME = "slicekeeper-operator"
DEFAULT_LEASE_SECONDS = 15
"""client-go's default lease duration (its renew deadline 10 s, its retry 2 s: the same ratios)."""
logger = logging.getLogger(__name__)
logging.getLogger("leaderelection").setLevel(logging.WARNING)  # it logs every retry at INFO


def timing(lease_seconds: int) -> tuple[int, float, float]:
    """(lease duration, renew deadline, retry period) in client-go's ratios (15 / 10 / 2 s), the
    retry at least 1 s (the library's floor); a Lease records whole seconds."""
    if lease_seconds < 3:
        raise ValueError(f"a lease of {lease_seconds} s: at least 3 s (the library retries each second)")
    return lease_seconds, lease_seconds * 2 / 3, max(1.0, lease_seconds * 2 / 15)


def identity() -> str:
    """This replica: its pod's name (the chart passes it), else host and process."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


class OperatorLease:
    """One replica's side of the election. `wait_to_lead()` blocks until it holds the Lease;
    `keep_leading(lost)` renews it from a thread and calls `lost()` once it could not."""

    def __init__(
        self,
        configuration: kubernetes.client.Configuration,
        namespace: str,
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
        name: str = LEASE_NAME,
        holder: str | None = None,
    ) -> None:
        self.holder = holder or identity()
        self.where = f"{namespace}/{name}"
        lock = LeaseLock(name, namespace, self.holder)
        lock.api_instance = kubernetes.client.CoordinationV1Api(kubernetes.client.ApiClient(configuration))
        duration, deadline, retry = timing(lease_seconds)
        self._election = LeaderElection(
            Config(lock, duration, deadline, retry, onstarted_leading=lambda: None, onstopped_leading=None)
        )

    def wait_to_lead(self) -> None:
        logger.info("operator %s: waiting for the Lease %s", self.holder, self.where)
        self._election.acquire()
        logger.info("operator %s: holds the Lease %s, acting", self.holder, self.where)

    def keep_leading(self, lost: Callable[[], None]) -> threading.Thread:
        def renew() -> None:
            self._election.renew_loop()  # returns only when a renewal failed for the whole deadline
            logger.error("operator %s: lost the Lease %s", self.holder, self.where)
            lost()

        thread = threading.Thread(target=renew, name="operator-lease", daemon=True)
        thread.start()
        return thread


class _Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"standby: waiting for the operator Lease\n")

    def log_message(self, format: str, *args: object) -> None:
        """The probe's requests are not logged."""


@contextlib.contextmanager
def standby_liveness(endpoint: str | None) -> Iterator[None]:
    """A standby's answer on kopf's liveness endpoint (`http://host:port/path`) while it waits: it is
    alive, only not leading. The port is free again for kopf once the block ends."""
    if endpoint is None:
        yield
        return
    address = urlsplit(endpoint)
    server = http.server.ThreadingHTTPServer((address.hostname or "0.0.0.0", address.port or 80), _Healthy)
    thread = threading.Thread(target=server.serve_forever, name="standby-liveness", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
