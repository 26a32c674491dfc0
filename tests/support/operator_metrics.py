"""Reading the operator's metrics in the operator's tests, and what the emulated API server saw of its
requests, to hold one against the other.

`scrape` reads an endpoint (blocking: a few milliseconds, inside an `eventually` check) into samples;
`tally` picks one metric's non-zero samples by some of their labels; `sent_by_operator` counts the
requests the operator's own client (its User-Agent) sent to the emulator, by verb and resource as the
emulator parsed them, independently of how the operator names them.
"""

from __future__ import annotations

import collections
import urllib.request

from kmock._internal import enums
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from slicekeeper.operator.cluster import USER_AGENT

from tests.support.operator_harness import Kube

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
