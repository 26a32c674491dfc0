"""The operator's metrics registry, without an operator: exactly the metrics docs/operator.md's table
lists (names, types, labels); jobs and pods by phase as read from their sources; each handler timed
under its own name; and how `Cluster` names and judges an API request (verb, resource, error or not).

That they move when the operator acts is checked against the emulated API server:
tests/operator/test_operator_metrics.py.
"""

from __future__ import annotations

import asyncio
import inspect

import kubernetes
import pytest
from slicekeeper.operator.cluster import Cluster, request_kind
from slicekeeper.operator.metrics import HANDLERS, JOB_PHASES, POD_PHASES, OperatorMetrics

from tests.support.cli_runs import ROOT, DocumentedMetric, documented_metrics, metrics_table
from tests.support.operator_metrics import read, tally

SERVER = "http://127.0.0.1:1"
"""No API server: nothing here sends a request."""


def exercised() -> OperatorMetrics:
    """A registry with a sample of every metric (a labelled counter has none until first counted)."""
    metrics = OperatorMetrics()
    metrics.read_jobs_from(lambda: [("research", "Running")])
    metrics.read_pods_from(lambda: [("research", "Running")])
    metrics.api_requests.labels(verb="get", resource="pods").inc()
    metrics.api_errors.labels(verb="get", resource="pods", code="500").inc()
    metrics.hot_swaps.labels(namespace="research").inc()
    metrics.scale_events.labels(namespace="research", kind="down").inc()
    return metrics


def exported(metrics: OperatorMetrics) -> dict[str, DocumentedMetric]:
    """Each metric family by exposed name (a counter's with `_total`), its type and labels."""
    found = {}
    for family in metrics.registry.collect():
        name = f"{family.name}_total" if family.type == "counter" else family.name
        labels = {label for sample in family.samples for label in sample.labels if label != "le"}
        found[name] = DocumentedMetric(family.type, frozenset(labels))
    return found


def test_the_metrics_are_exactly_those_of_the_docs_table_with_their_types_and_labels():
    documented = documented_metrics("operator.md")
    assert exported(exercised()) == documented
    # The comparison sees a missing row (the table is parsed, not found empty).
    text = (ROOT / "docs" / "operator.md").read_text()
    [row] = [
        line for line in text.splitlines() if line.startswith("| `slicekeeper_operator_hot_swaps_total`")
    ]
    assert metrics_table(text.replace(row, "")) != documented


def test_jobs_and_pods_have_every_phase_of_each_namespace_that_has_some_and_none_is_unknown():
    metrics = OperatorMetrics()
    metrics.read_jobs_from(lambda: [("a", "Running"), ("a", "Running"), ("b", None)])
    metrics.read_pods_from(lambda: [("a", "Pending"), ("a", "Evicted")])
    samples = read(metrics.registry)
    jobs = {labels: value for (name, labels), value in samples.items() if name == "slicekeeper_operator_jobs"}
    assert len(jobs) == 2 * len(JOB_PHASES)  # zeros included: a phase's line drops to 0, it does not vanish
    assert tally(samples, "slicekeeper_operator_jobs", "namespace", "phase") == {
        ("a", "Running"): 2,
        ("b", "Unknown"): 1,
    }
    pods = tally(samples, "slicekeeper_operator_pods", "namespace", "phase")
    assert pods == {("a", "Pending"): 1, ("a", "Evicted"): 1}  # a phase not foreseen is shown too
    assert "Unknown" in POD_PHASES


def test_a_timed_handler_keeps_its_name_and_kind_and_each_call_is_observed_under_its_handler():
    metrics = OperatorMetrics()

    @metrics.timed("timer")
    def keep(**_: object) -> str:
        return "kept"

    @metrics.timed("pod_event")
    async def pod_event(**_: object) -> str:
        return "seen"

    # kopf names a handler by its function (its progress is stored under that id) and runs a
    # coroutine function on its event loop, anything else in a thread.
    assert (keep.__name__, pod_event.__name__) == ("keep", "pod_event")
    assert inspect.iscoroutinefunction(pod_event) and not inspect.iscoroutinefunction(keep)
    assert keep() == "kept" and keep() == "kept"
    assert asyncio.run(pod_event()) == "seen"
    calls = tally(read(metrics.registry), "slicekeeper_operator_reconcile_seconds_count", "handler")
    assert calls == {("timer",): 2, ("pod_event",): 1}
    assert set(HANDLERS) >= {"timer", "pod_event"}


@pytest.mark.parametrize(
    ("method", "url", "kind"),
    [
        ("POST", f"{SERVER}/api/v1/namespaces/research/pods", ("create", "pods")),
        ("GET", f"{SERVER}/api/v1/namespaces/research/pods?labelSelector=a%3Db&limit=500", ("list", "pods")),
        ("GET", f"{SERVER}/api/v1/namespaces/research/pods/p-0", ("get", "pods")),
        ("GET", f"{SERVER}/api/v1/pods?watch=true", ("watch", "pods")),
        ("DELETE", f"{SERVER}/api/v1/namespaces/research/services/tiny-lm", ("delete", "services")),
        ("DELETE", f"{SERVER}/api/v1/namespaces/research/pods", ("deletecollection", "pods")),
        (
            "PATCH",
            f"{SERVER}/apis/slicekeeper.dev/v1alpha1/namespaces/research/trainingjobs/j/status",
            ("patch", "trainingjobs/status"),
        ),
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/research/leases/j-leader", ("update", "leases")),
        ("GET", f"{SERVER}/api/v1/nodes/n-1", ("get", "nodes")),
        ("GET", f"{SERVER}/api/v1/namespaces/research", ("get", "namespaces")),
        ("GET", f"{SERVER}/api/v1/namespaces", ("list", "namespaces")),
        ("GET", f"{SERVER}/version", ("list", "unknown")),
    ],
)
def test_a_request_is_named_by_its_kubernetes_verb_and_resource(method, url, kind):
    assert request_kind(method, url) == kind


@pytest.mark.parametrize(
    ("method", "path", "status", "error"),
    [
        ("POST", "pods", 201, None),
        ("POST", "pods", 409, None),  # already there: done
        ("DELETE", "pods/p", 404, None),  # already gone: done
        ("GET", "pods/p", 404, None),  # the pod store's check: not there
        ("PATCH", "pods/p", 404, None),  # a notice for a pod already gone: done
        ("PATCH", "pods/p", 422, "422"),  # a patch refused is an error
        ("POST", "pods", 500, "500"),
        ("GET", "pods", None, "none"),  # no answer at all
    ],
)
def test_a_request_counts_once_and_as_an_error_unless_the_operator_takes_the_answer_as_done(
    method, path, status, error
):
    cluster = Cluster(kubernetes.client.Configuration(host=SERVER))
    cluster.record_request(method, f"{SERVER}/api/v1/namespaces/research/{path}", status)
    samples = read(cluster.metrics.registry)
    assert sum(tally(samples, "slicekeeper_operator_api_requests_total", "verb").values()) == 1
    errors = tally(samples, "slicekeeper_operator_api_errors_total", "code")
    assert errors == ({} if error is None else {(error,): 1})
