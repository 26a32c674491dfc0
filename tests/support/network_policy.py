"""Who a NetworkPolicy lets in: its ingress rules evaluated as the Kubernetes network model defines
them (https://kubernetes.io/docs/concepts/services-networking/network-policies/), for one policy, a
connection from a pod to a port of another. No network plugin is at hand here; the rendered policy is
checked against these rules, and a cluster's plugin enforces the same ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Endpoint:
    """A pod: its namespace (with the namespace's labels) and its own labels."""

    namespace: str
    labels: dict[str, str] = field(default_factory=dict)

    def namespace_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace}


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions with In/NotIn/Exists/DoesNotExist) on `labels`;
    the empty selector selects everything."""
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def _peer_matches(peer: dict[str, Any], policy_namespace: str, source: Endpoint) -> bool:
    pods, namespaces = peer.get("podSelector"), peer.get("namespaceSelector")
    if "ipBlock" in peer:
        return False  # pod IPs are not what these checks are about
    if namespaces is None:
        in_namespace = source.namespace == policy_namespace
    else:
        in_namespace = selects(namespaces, source.namespace_labels())
    return in_namespace and (pods is None or selects(pods, source.labels))


def admits(policy: dict[str, Any], source: Endpoint, target: Endpoint, port: int) -> bool:
    """Would `policy` let `source` connect to TCP `port` of `target`? A pod the policy does not select
    is not isolated by it (True)."""
    namespace = policy["metadata"]["namespace"]
    spec = policy["spec"]
    if target.namespace != namespace or not selects(spec["podSelector"], target.labels):
        return True
    if "Ingress" not in spec.get("policyTypes", ["Ingress"]):
        return True
    for rule in spec.get("ingress") or []:
        peers = rule.get("from")
        ports = rule.get("ports")
        peer_ok = not peers or any(_peer_matches(p, namespace, source) for p in peers)
        port_ok = not ports or any(
            p.get("protocol", "TCP") == "TCP" and p.get("port") in (None, port) for p in ports
        )
        if peer_ok and port_ok:
            return True
    return False
