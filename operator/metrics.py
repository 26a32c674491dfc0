"""The operator's own Prometheus metrics: what a dashboard or an alert needs to see of the operator itself
(the supervisors in the pods export the jobs' training metrics, supervisor/metrics.py).

On a registry of the operator's own (a test gets a fresh one with each operator), served on
`--metrics-port` (METRICS_PORT by default) by prometheus-client's own HTTP server, in a thread of its
own: a scrape is answered even while kopf's event loop is busy (a 25,000-pod listing), so a slow
operator does not look like a dead one.

Two kinds of figures:

- state, read at scrape time from what the operator already keeps, never from a second bookkeeping:
  the TrainingJobs by phase from kopf's `jobs` index, the job pods by phase from the operator's pod
  store (operator/pod_store.py). `read_jobs_from` and `read_pods_from` name the sources;
- events, counted where they happen: every API request (operator/cluster.py counts each attempt,
  retries included), each pod the operator replaced, each scale event it recorded in a job's status,
  and the time each kopf handler took (`timed`).

Counters start at 0 with the process: a restarted operator counts again from 0, which Prometheus's
`rate()` and `increase()` take as a counter reset; nothing is counted twice by two processes.
"""

from __future__ import annotations

import functools
import inspect
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar, cast
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from slicekeeper.api import JobPhase

METRICS_PORT = 9464
"""The operator's metrics port (named `metrics` in its Deployment), as the supervisors' in the job pods."""
HANDLERS = ("reconcile", "timer", "pod_event", "node_event", "delete")
"""The `handler` label of the reconcile histogram: create/resume/update, the status timer, the pod and
node event handlers, the deletion's finalizer (operator/handlers.py)."""
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""From a handler that only reads the store (milliseconds) to a first listing of a 25,000-pod job."""
JOB_PHASES = (*(phase.value for phase in JobPhase), "Unknown")
"""`Unknown`: a TrainingJob with no phase yet (not reconciled so far)."""
POD_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
NO_ANSWER = "none"
"""The `code` of an API error where no HTTP answer came (connection refused or cut, timeout)."""

Function = TypeVar("Function", bound=Callable[..., Any])
Placed = tuple[str, str | None]
"""(namespace, phase) of one TrainingJob or pod; None: no phase yet."""


def _by_namespace_and_phase(
    name: str, documentation: str, placed: Iterable[Placed], phases: tuple[str, ...]
) -> GaugeMetricFamily:
    """A gauge with a sample for every phase of every namespace that has any (0 included, so that a
    dashboard's line for a phase drops to 0 instead of vanishing while the namespace has objects)."""
    family = GaugeMetricFamily(name, documentation, labels=["namespace", "phase"])
    counts = Tally((namespace, phase or "Unknown") for namespace, phase in placed)
    for namespace in sorted({namespace for namespace, _ in counts}):
        extra = sorted({phase for space, phase in counts if space == namespace} - set(phases))
        for phase in (*phases, *extra):
            family.add_metric([namespace, phase], counts[(namespace, phase)])
    return family


class _StateCollector(Collector):
    """Jobs and pods by phase, read from the operator's own state at each scrape."""

    def __init__(self) -> None:
        self.jobs: Callable[[], Iterable[Placed]] = list
        self.pods: Callable[[], Iterable[Placed]] = list

    def collect(self) -> Iterator[Metric]:
        yield _by_namespace_and_phase(
            "slicekeeper_operator_jobs", "TrainingJobs by namespace and phase.", self.jobs(), JOB_PHASES
        )
        yield _by_namespace_and_phase(
            "slicekeeper_operator_pods",
            "TrainingJob pods by namespace and phase, as the operator's pod store has them.",
            self.pods(),
            POD_PHASES,
        )


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._state = _StateCollector()
        self.registry.register(self._state)
        self.api_requests = Counter(
            "slicekeeper_operator_api_requests",
            "HTTP requests the operator's own API client made (each retry too), by verb and resource.",
            ["verb", "resource"],
            registry=self.registry,
        )
        self.api_errors = Counter(
            "slicekeeper_operator_api_errors",
            "API requests that failed, by verb, resource and HTTP status (`none`: no answer); a 409 to a "
            "create and a 404 to a get or delete are answers, not errors.",
            ["verb", "resource", "code"],
            registry=self.registry,
        )
        self.hot_swaps = Counter(
            "slicekeeper_operator_hot_swaps",
            "Job pods the operator replaced (created again after a failure, a deletion or a lost node).",
            ["namespace"],
            registry=self.registry,
        )
        self.scale_events = Counter(
            "slicekeeper_operator_scale_events",
            "Scale-downs and scale-ups of a job the operator recorded in its status, by kind (down, up).",
            ["namespace", "kind"],
            registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            "slicekeeper_operator_reconcile_seconds",
            "Time spent in each kopf handler of the operator.",
            ["handler"],
            buckets=RECONCILE_BUCKETS,
            registry=self.registry,
        )
        for handler in HANDLERS:  # every handler's series from the start, at 0
            self.reconcile_seconds.labels(handler=handler)
        self._server: WSGIServer | None = None

    def read_jobs_from(self, jobs: Callable[[], Iterable[Placed]]) -> None:
        """Where a scrape reads the TrainingJobs from: (namespace, phase) of each."""
        self._state.jobs = jobs

    def read_pods_from(self, pods: Callable[[], Iterable[Placed]]) -> None:
        """Where a scrape reads the job pods from: (namespace, phase) of each."""
        self._state.pods = pods

    def timed(self, handler: str) -> Callable[[Function], Function]:
        """A decorator: the time each call of a kopf handler (a function or a coroutine function) takes
        goes to the reconcile histogram under `handler`. The handler keeps its name, so kopf's id for
        it (and the progress kopf keeps under that id on the objects) is unchanged."""
        histogram = self.reconcile_seconds.labels(handler=handler)

        def decorate(function: Function) -> Function:
            if inspect.iscoroutinefunction(function):

                @functools.wraps(function)
                async def timed_coroutine(*args: Any, **kwargs: Any) -> Any:
                    with histogram.time():
                        return await function(*args, **kwargs)

                return cast(Function, timed_coroutine)

            @functools.wraps(function)
            def timed_function(*args: Any, **kwargs: Any) -> Any:
                with histogram.time():
                    return function(*args, **kwargs)

            return cast(Function, timed_function)

        return decorate

    def serve(self, port: int = METRICS_PORT, address: str = "0.0.0.0") -> int:
        """Serve /metrics from a thread of its own; the port bound (0 picks a free one)."""
        if self._server is None:
            self._server, _thread = start_http_server(port, addr=address, registry=self.registry)
        return int(self._server.server_port)

    def close(self) -> None:
        """Stop serving (a test's operator ends; the real one serves until its process ends)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
