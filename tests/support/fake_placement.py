"""Where the fake scheduler (tests/support/fake_kubelet.py) may place a pod: the fake TPU nodes, as
Node objects with the GKE TPU labels (one node pool per slice), and whether a pod fits one.

A pod fits a Ready, uncordoned node that matches its nodeSelector and required node affinity
(`kubernetes.io/hostname NotIn`), in the node pool its slice already uses and not in a pool another
slice of its job uses, one TPU pod per node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

POOL_LABEL = "cloud.google.com/gke-nodepool"
HOSTNAME_LABEL = "kubernetes.io/hostname"
TPU_RESOURCE = "google.com/tpu"


@dataclass
class FakeNode:
    name: str
    pool: str
    labels: dict[str, str]
    core: int = 0
    """The core of this machine its pods' own work runs on (separate machines never compete for
    one while they compute; see docs/supervisor.md, "Straggler detection")."""
    ready: bool = True
    cordoned: bool = False

    def manifest(self) -> dict[str, Any]:
        ready = "True" if self.ready else "False"
        return {
            "metadata": {
                "name": self.name,
                "labels": {**self.labels, POOL_LABEL: self.pool, HOSTNAME_LABEL: self.name},
            },
            "spec": {"unschedulable": self.cordoned},
            "status": {
                "capacity": {TPU_RESOURCE: "4"},
                "allocatable": {TPU_RESOURCE: "4"},
                "conditions": [{"type": "Ready", "status": ready, "reason": "KubeletReady"}],
            },
        }


def fits(
    node: FakeNode, pod: dict[str, Any], pods: list[dict[str, Any]], nodes: Mapping[str, FakeNode]
) -> bool:
    """Whether `pod` may go to `node`, given the pods of the round (`pods`, some placed on `nodes`)."""
    spec = pod["spec"]
    labels = node.manifest()["metadata"]["labels"]
    if not node.ready or node.cordoned:
        return False
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    for term in (required or {}).get("nodeSelectorTerms", []):
        for expression in term.get("matchExpressions", []):
            value = labels.get(expression["key"])
            if expression["operator"] == "NotIn" and value in expression["values"]:
                return False
            if expression["operator"] == "In" and value not in expression["values"]:
                return False
    if any((p.get("spec") or {}).get("nodeName") == node.name for p in pods):
        return False  # one TPU host pod per node: it takes every chip
    mine = pod["metadata"]["labels"]
    job, slice_index = mine["slicekeeper.dev/job"], mine["slicekeeper.dev/slice"]
    for other in pods:
        placed = (other.get("spec") or {}).get("nodeName")
        theirs = other["metadata"]["labels"]
        if placed not in nodes or theirs.get("slicekeeper.dev/job") != job:
            continue
        same_slice = theirs.get("slicekeeper.dev/slice") == slice_index
        same_pool = nodes[placed].pool == node.pool
        if same_slice != same_pool:
            return False  # a slice is one node pool, and a pool serves one slice
    return True
