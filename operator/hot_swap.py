"""Cluster-level hot-swap: when a TPU pod must be replaced, and what replaces it.

A pod is replaced when it failed (phase Failed: the supervisor gave up, or the kubelet killed it),
when it disappeared (deleted, or its node was removed; a NotReady node's pods are deleted), or when its own
supervisor asked for it: the supervisor may write only its own pod, and marks it with the
annotation `slicekeeper.dev/replace: <reason>` (for instance a persistent straggler or a chip
error it saw). The replacement keeps the identity (name, hostname, environment: the same host of
the job, which restores its shard from a peer) and keeps away from the faulty node: its affinity
requires `kubernetes.io/hostname NotIn [the nodes this host failed on]`. Those nodes travel with the
host in the annotation `slicekeeper.dev/avoid-nodes`, so a host that fails on a second node avoids
both.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from slicekeeper.operator.render import GROUP, Manifest, RenderedJob

from slicekeeper import protocol

REPLACE_ANNOTATION = protocol.ANNOTATION_REPLACE
"""Set by a pod's own supervisor: replace this pod (the value says why)."""
AVOID_ANNOTATION = f"{GROUP}/avoid-nodes"
"""Comma-separated nodes this host must not be scheduled on again."""
HOSTNAME_LABEL = "kubernetes.io/hostname"


def replacement_reason(pod: dict[str, Any]) -> str | None:
    """Why `pod` must be replaced, or None while it is healthy (or still pending)."""
    annotations = pod.get("metadata", {}).get("annotations") or {}
    if REPLACE_ANNOTATION in annotations:
        return f"its supervisor asked: {annotations[REPLACE_ANNOTATION] or 'no reason given'}"
    status = pod.get("status") or {}
    if status.get("phase") == "Failed":
        return f"it failed ({status.get('reason') or 'no reason given'})"
    return None


def terminated_state(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The `terminated` state of the pod's container (exit code, reason, message), if it ended."""
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated:
            return dict(terminated)
    return None


def avoided_nodes(pod: dict[str, Any]) -> list[str]:
    """The nodes the pod's host failed on, this pod's own node included."""
    annotations = pod.get("metadata", {}).get("annotations") or {}
    nodes = [n for n in (annotations.get(AVOID_ANNOTATION) or "").split(",") if n]
    node = pod.get("spec", {}).get("nodeName")
    if node and node not in nodes:
        nodes.append(node)
    return nodes


def replacement(rendered: RenderedJob, pod: dict[str, Any], going: Sequence[str] = ()) -> Manifest:
    """A fresh pod for the same host as `pod`, kept off the nodes that host failed on and off the
    nodes `going` (they announce their loss: a pod there would be handed over again)."""
    host = rendered.layout.host(int(pod["metadata"]["labels"][f"{GROUP}/host"]))
    fresh = copy.deepcopy(rendered.pod(host))
    failed_on = avoided_nodes(pod)
    if failed_on:  # the host's history, carried on to its next replacement
        fresh["metadata"].setdefault("annotations", {})[AVOID_ANNOTATION] = ",".join(failed_on)
    nodes = failed_on + [node for node in going if node not in failed_on]
    if nodes:
        required = {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "NotIn", "values": nodes}]}
        fresh["spec"]["affinity"]["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [required]}
        }
    return fresh
