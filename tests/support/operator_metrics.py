"""Reading the operator's metrics in the operator's tests, and what the emulated API server saw of its
requests, to hold one against the other.

`scrape` reads an endpoint (blocking: a few milliseconds, inside an `eventually` check) into samples;
`tally` picks one metric's non-zero samples by some of their labels; `sent_by_operator` counts the
requests the operator's own client (its User-Agent) sent to the emulator, by verb and resource as the
emulator parsed them, independently of how the operator names them. The example job's life
(`phases_agree`, `leader_publishes`, `counted_as_in_status`) is driven and checked alike by the
in-process operator's tests and the chart-started one's.
"""

from __future__ import annotations

import collections
import json
import urllib.request
from typing import Any

from kmock._internal import enums
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from slicekeeper.operator.cluster import USER_AGENT

from tests.support.operator_example import NS
from tests.support.operator_harness import Kube, eventually

JOBS, PODS = "slicekeeper_operator_jobs", "slicekeeper_operator_pods"
HOT_SWAPS, SCALE_EVENTS = "slicekeeper_operator_hot_swaps_total", "slicekeeper_operator_scale_events_total"

Labels = frozenset[tuple[str, str]]
Samples = dict[tuple[str, Labels], float]

VERBS = {
    enums.action.FETCH: "get",
    enums.action.LIST: "list",
    enums.action.WATCH: "watch",
    enums.action.CREATE: "create",
    enums.action.UPDATE: "patch",
    enums.action.DELETE: "delete",
}
"""kmock's action of a request -> the Kubernetes verb (a PUT is an `update`, see `sent_by_operator`)."""


def samples_of(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as response:
        return samples_of(response.read().decode())


def read(registry: CollectorRegistry) -> Samples:
    """The samples of a registry as a scrape would have them (an operator that no longer serves)."""
    return samples_of(generate_latest(registry).decode())


def tally(samples: Samples, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """The non-zero samples of `name`, by the values of `labels` (summed over any other label)."""
    found: dict[tuple[str, ...], float] = collections.defaultdict(float)
    for (sample, sample_labels), value in samples.items():
        if sample == name and value:
            values = dict(sample_labels)
            found[tuple(values[label] for label in labels)] += value
    return dict(found)


def sent_by_operator(kube: Kube, start: int = 0, end: int | None = None) -> dict[tuple[str, ...], float]:
    """(verb, resource) of every request the operator's client sent, among the emulator's requests
    `start` to `end` (every request is logged as it arrives, refused ones too), with their count."""
    found: dict[tuple[str, ...], float] = collections.defaultdict(float)
    for request in kube.emulator._requests[start:end]:
        agent = next((v for k, v in request.headers.items() if k.lower() == "user-agent"), None)
        if agent != USER_AGENT:
            continue
        assert request.action is not None and request.resource is not None, request
        verb = "update" if request.method == enums.method.PUT else VERBS[request.action]
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        found[(verb, resource)] += 1
    return dict(found)


# --- the example job's life, as the operator's metrics follow it ------------------------------------


async def phases_agree(kube: Kube, job: str, pods: dict[str, int]) -> None:
    """Wait until the API server has the job in phase `job` and its pods in `pods` (phase: count), and
    the operator's metrics say the same."""

    def agreed() -> bool:
        samples = scrape(kube.metrics_url)
        on_server = collections.Counter(p["status"].get("phase") for p in kube.pods(NS).values())
        return (
            on_server == pods
            and kube.job(NS, "tiny-lm").get("status", {}).get("phase") == job
            and tally(samples, JOBS, "namespace", "phase") == {(NS, job): 1}
            and tally(samples, PODS, "namespace", "phase") == {(NS, k): v for k, v in on_server.items()}
        )

    await eventually(agreed, what=f"the metrics: job {job}, pods {pods}, as the API server has them")


def uid_of(kube: Kube, pod: str) -> str | None:
    return kube.pods(NS).get(pod, {}).get("metadata", {}).get("uid")


async def leader_publishes(kube: Kube, **view: Any) -> None:
    text = json.dumps({"state": "running", **view})
    await kube.patch_pod(NS, "tiny-lm-s0-w0", {"metadata": {"annotations": {"slicekeeper.dev/status": text}}})


def counted_as_in_status(kube: Kube) -> bool:
    """The pods the operator replaced: counted in its metrics as the job's status has them (its
    `restarts.replace`, from the annotation each replacement carries); at least one."""
    replaced = kube.job(NS, "tiny-lm").get("status", {}).get("restarts", {}).get("replace", 0)
    return replaced > 0 and tally(scrape(kube.metrics_url), HOT_SWAPS, "namespace") == {(NS,): replaced}
