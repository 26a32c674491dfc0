"""The Helm chart as a cluster would get it: rendered by the Helm engine itself (helm-python-sdk).

Every test that reads what `helm install` applies (the operator's Deployment, the RBAC, the admission
policy, the monitors and rules) reads it from here, rendered from charts/slicekeeper with the values
given, never from a copy of the manifests: there is one source.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import helm_python
import kubernetes_validate
import yaml

from tests.support import monitoring_kinds
from tests.support.cli_runs import ROOT

CHART = ROOT / "charts" / "slicekeeper"
RELEASE = "slicekeeper"
NAMESPACE = "slicekeeper-system"

Manifest = dict[str, Any]


@functools.cache
def _rendered(values_json: str) -> tuple[tuple[str, str], ...]:
    chart = helm_python.Chart.load(CHART)
    try:
        templates = chart.render(json.loads(values_json), name=RELEASE, namespace=NAMESPACE, is_install=True)
    finally:
        chart.close()
    return tuple(sorted(templates.items()))


def rendered(values: dict[str, Any] | None = None) -> dict[str, list[Manifest]]:
    """{template path: its objects} for the chart with `values` (None: the defaults); each call
    gets its own copies."""
    templates = _rendered(json.dumps(values or {}, sort_keys=True))
    return {path: [d for d in yaml.safe_load_all(text) if d] for path, text in templates}


def objects(values: dict[str, Any] | None = None) -> list[Manifest]:
    """Every object the chart installs with `values`, template by template."""
    return [manifest for manifests in rendered(values).values() for manifest in manifests]


def the(kind: str, name: str | None = None, values: dict[str, Any] | None = None) -> Manifest:
    """The one object of `kind` (named `name`, if given) the chart installs with `values`."""
    (found,) = [
        o for o in objects(values) if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    return found


def invalid(manifests: list[Manifest], kubernetes: str = "1.31") -> dict[tuple[str, str], str]:
    """{(kind, name): what is wrong} of `manifests`: Kubernetes' own kinds checked against the
    Kubernetes schema (kubernetes-validate, strict), the Prometheus Operator's against its CRDs."""
    found = {}
    monitoring = [m for m in manifests if m["apiVersion"].startswith("monitoring.coreos.com/")]
    if monitoring:
        found.update(monitoring_kinds.errors(monitoring))
    for manifest in manifests:
        if manifest in monitoring:
            continue
        try:
            kubernetes_validate.validate(manifest, kubernetes, strict=True)
        except kubernetes_validate.ValidationError as error:
            found[(manifest["kind"], manifest["metadata"]["name"])] = str(error)
    return found
