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
HOT_SWAPS_ANNOTATION = f"{GROUP}/hot-swaps"
"""How often this host's pod was replaced (the job's `status.restarts.replace` sums it)."""


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


def replacement(
    rendered: RenderedJob, host: int, failed_on: Sequence[str], going: Sequence[str] = (), *, hot_swaps: int
) -> Manifest:
    """A fresh pod for host `host`, its `hot_swaps`-th, kept off the nodes the host failed on
    (`failed_on`, carried on in its annotation) and off the nodes `going` (they announce their loss:
    a pod there would only be handed over again)."""
    fresh = copy.deepcopy(rendered.pod(rendered.layout.host(host)))
    annotations = fresh["metadata"].setdefault("annotations", {})
    annotations[HOT_SWAPS_ANNOTATION] = str(hot_swaps)
    if failed_on:  # the host's history, carried on to its next replacement
        annotations[AVOID_ANNOTATION] = ",".join(failed_on)
    nodes = list(failed_on) + [node for node in going if node not in failed_on]
    if nodes:
        required = {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "NotIn", "values": nodes}]}
        fresh["spec"]["affinity"]["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [required]}
        }
    return fresh


def host_of(pod: dict[str, Any]) -> int:
    """The job's host a pod (or its summary) serves (its label)."""
    return int(pod["metadata"]["labels"][f"{GROUP}/host"])
