"""Announced losses: what a node says of its own end, and the notice it puts on the job pods on it.

GKE says ahead of time that a TPU node will go (docs/operations.md, "Announced losses", has each
signal with its source):

- the label `cloud.google.com/scheduled-maintenance-time`: the VM under the node has a host
  maintenance event scheduled, its value the Unix time the maintenance window starts (GKE
  1.31.1-gke.2008000 and later, nodes with GPUs or TPUs);
- the taint `cloud.google.com/impending-node-termination`: GKE is terminating the node now (host
  maintenance under way, a Spot VM preempted); the cluster autoscaler's taint
  `ToBeDeletedByClusterAutoscaler` says the same of a node it is deleting.

The operator turns these into the pod annotation `slicekeeper.dev/notice` (`protocol.ANNOTATION_NOTICE`)
on every job pod bound to the node, JSON `{"kind", "at", "source"}`: kind `maintenance` with `at` the
label's time, kind `preemption` with `at` now plus the pod's termination grace period (the most it
will get). A termination taint wins over the label: it is the sooner loss. When the node no longer
says anything (the maintenance was rescheduled away, the autoscaler changed its mind) the annotation
is removed: a notice that is gone is withdrawn.

Pure: `node_signal` reads a node, `notice_change` decides one pod's write, `NoticesWritten` keeps
what the operator wrote until its pod watch shows it; operator/pod_actions.py applies them, through
operator/cluster.py.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from slicekeeper import protocol

logger = logging.getLogger(__name__)

NOTICE_ANNOTATION = protocol.ANNOTATION_NOTICE
MAINTENANCE_TIME_LABEL = "cloud.google.com/scheduled-maintenance-time"
"""GKE: the Unix time (seconds) the node's VM is scheduled for host maintenance."""
TERMINATION_TAINTS = ("cloud.google.com/impending-node-termination", "ToBeDeletedByClusterAutoscaler")
"""Taints on a node that is being terminated now (GKE), or deleted (the cluster autoscaler)."""
DEFAULT_GRACE_SECONDS = 30
"""Kubernetes' own default terminationGracePeriodSeconds, for a pod that does not say."""
WATCH_CATCH_UP_SECONDS = 60.0
"""How long the operator trusts its own notice write over its pod watch's older view of the pod: a
watch later than that (or someone else's write in between) costs one write again, no more."""


class NoticeKind(StrEnum):
    MAINTENANCE = "maintenance"
    """A host maintenance event is scheduled: the node goes at `at`, typically days ahead."""
    PREEMPTION = "preemption"
    """The node is being terminated now: its pods get their termination grace period, no more."""


@dataclass(frozen=True)
class NodeSignal:
    """What a node says of its own end: the kind of loss, when (None: as soon as its pods are stopped,
    within their grace), and the signal read, as `label NAME=VALUE` or `taint KEY:EFFECT`."""

    kind: NoticeKind
    at: float | None
    source: str


@dataclass(frozen=True)
class NoticeChange:
    """One pod's annotation to write: the notice's JSON, or None to remove it."""

    value: str | None


def node_signal(node: Mapping[str, Any]) -> NodeSignal | None:
    """The loss `node` announces, None when it announces none (or nothing readable)."""
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("key") in TERMINATION_TAINTS:
            effect = f":{taint['effect']}" if taint.get("effect") else ""
            return NodeSignal(NoticeKind.PREEMPTION, None, f"taint {taint['key']}{effect}")
    labels = (node.get("metadata") or {}).get("labels") or {}
    value = labels.get(MAINTENANCE_TIME_LABEL)
    if value is None:
        return None
    try:
        at = float(value)
    except ValueError:
        name = (node.get("metadata") or {}).get("name")
        logger.warning("node %s: label %s=%r is no Unix time; ignored", name, MAINTENANCE_TIME_LABEL, value)
        return None
    return NodeSignal(NoticeKind.MAINTENANCE, at, f"label {MAINTENANCE_TIME_LABEL}={value}")


def notice(signal: NodeSignal, *, grace_seconds: float, now: float) -> dict[str, Any]:
    """The notice for a pod whose node announced `signal`, as the annotation's JSON holds it."""
    at = signal.at if signal.at is not None else now + grace_seconds
    return {"kind": signal.kind.value, "at": int(at), "source": signal.source}


def notice_change(
    signal: NodeSignal | None, current: str | None, *, grace_seconds: float, now: float
) -> NoticeChange | None:
    """What to write on a pod whose node announces `signal` and whose annotation is `current` (None:
    it has none); None when the pod already says it. A notice of the same kind and source is the
    same notice: a preemption's `at` (now + grace) is not moved on by each node event."""
    if signal is None:
        return None if current is None else NoticeChange(None)
    if current is not None:
        try:
            held = json.loads(current)
        except ValueError:
            held = None
        if isinstance(held, dict) and (held.get("kind"), held.get("source")) == (
            signal.kind.value,
            signal.source,
        ):
            return None
    value = json.dumps(notice(signal, grace_seconds=grace_seconds, now=now), sort_keys=True)
    return NoticeChange(value)


def announcement(signal: NodeSignal | None, previous: NodeSignal | None) -> str:
    """What changed on a node, for the operator's log line."""
    if signal is None:
        return f"no longer announces a loss ({previous.source if previous else 'nothing before'})"
    return f"announces a {signal.kind.value} ({signal.source})"


class NoticesWritten:
    """The notices the operator wrote whose pod events its watch has not delivered yet.

    The operator decides from its pod store, which hears of the operator's own writes only through the
    watch: until then, a job's timer or another event of the node would find the pod without the
    notice just put on it (or with the one just taken off) and write it again (seen on a loaded
    machine; tests/operator/test_operator_notices.py makes the watch lag on purpose). A write is
    remembered by pod uid until the store shows it or WATCH_CATCH_UP_SECONDS pass. Not thread-safe:
    the caller holds its lock across the read, the decision and the write."""

    def __init__(self) -> None:
        self._written: dict[str, tuple[str | None, float]] = {}
        """Pod uid -> (the annotation written, None: removed; when it stops being trusted)."""

    def current(self, uid: str, seen: str | None, *, now: float) -> str | None:
        """The pod's notice annotation as the operator knows it: its own write, until the store's
        view `seen` shows that write (or it expires); else `seen`."""
        written = self._written.get(uid)
        if written is None:
            return seen
        value, until = written
        if value == seen or now >= until:
            del self._written[uid]
            return seen
        return value

    def wrote(self, uid: str, value: str | None, *, now: float) -> None:
        """The operator put `value` on pod `uid` (None: took its notice off)."""
        self._written[uid] = (value, now + WATCH_CATCH_UP_SECONDS)
        for stale in [key for key, (_, until) in self._written.items() if now >= until]:
            del self._written[stale]
