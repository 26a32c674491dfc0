"""What the operator knows of its pods and nodes, kept in its own memory from its watches.

Why not kopf indexes: kopf (1.45.2) runs no handler before every index is filled, and fills them with
every worker waiting on one toggle set that wakes them all on each indexed object. For a restarted
operator that is quadratic in the pods: 4,000 hosts took 92 s to be served again, 25,000 were not
within 5 minutes (benchmarks/operator_scale.py). So the handlers keep this store instead:

- the operator's pod informer (operator/informer.py) lists the jobs' pods and then watches them; a
  pod is kept as a small summary (`summary`), so a 25,000-host job costs megabytes, not the 100 MB of
  its JSON;
- a listing's pods (`listing_began`, `listed`, `listing_ended`) are the whole state once it ends: a
  pod it did not bring went while no watch could say so (a watch gap ends in a 410 and a new
  listing). A pod the operator deleted itself during the listing (`deleted`) is not brought back by
  a page taken before the delete;
- `pods(namespace, job)` are a job's pods; it waits for the informers' first listings (a restarted
  operator resumes its jobs before they are complete);
- the node event handler records which nodes are NotReady (`observe_node`) and the loss each node
  announces (`observe_signal`, operator/notices.py); `pods_on(node)` are the job pods bound to a
  node, `summaries_on(node)` the same as summaries.

Thread-safe: the informers write from their threads, the job handlers (sync) read from kopf's thread
pool, the node handler from kopf's event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slicekeeper.operator.notices import NodeSignal
from slicekeeper.operator.render import GROUP, LABEL_JOB

PodSummary = dict[str, Any]
JobKey = tuple[str, str]
"""(namespace, job name)."""


def summary(pod: Mapping[str, Any]) -> PodSummary:
    """What the operator reads of a pod (name, labels, our annotations, node, termination grace, phase,
    scheduling), in the shape of the pod, so that the status derivation, hot-swap and the notices read
    a summary as they would a pod."""
    metadata = pod.get("metadata") or {}
    annotations = {k: v for k, v in (metadata.get("annotations") or {}).items() if k.startswith(GROUP)}
    status = pod.get("status") or {}
    scheduling = [c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"]
    return {
        "metadata": {
            "name": metadata.get("name"),
            "namespace": metadata.get("namespace"),
            "uid": metadata.get("uid"),
            "labels": dict(metadata.get("labels") or {}),
            "annotations": annotations,
        },
        "spec": {
            "nodeName": (pod.get("spec") or {}).get("nodeName"),
            "terminationGracePeriodSeconds": (pod.get("spec") or {}).get("terminationGracePeriodSeconds"),
        },
        "status": {"phase": status.get("phase"), "conditions": scheduling},
    }


def _summarized(pod: Mapping[str, Any]) -> tuple[PodSummary, JobKey, str] | None:
    """(its summary, its job, its name) for a job pod; None for a pod without the job's label."""
    pod_summary = summary(pod)
    metadata = pod_summary["metadata"]
    job = metadata["labels"].get(LABEL_JOB)
    if job is None:
        return None
    return pod_summary, (str(metadata["namespace"]), str(job)), str(metadata["name"])


@dataclass
class _Listing:
    seen: set[tuple[JobKey, str]] = field(default_factory=set)
    """The pods it brought."""
    changed: set[tuple[JobKey, str]] = field(default_factory=set)
    """The pods an event or the operator's own delete described since it began."""


def node_not_ready(node: Mapping[str, Any]) -> bool:
    """A node whose Ready condition is there and not True (no condition yet: not judged)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    return ready is not None and ready.get("status") != "True"


class NotListedYet(Exception):
    """The pods are still being listed for the first time."""


class PodStore:
    """Job pods by job and by node, the NotReady nodes and the losses nodes announce, as the informers
    and the node events last described them."""

    def __init__(self, scopes: Iterable[str | None] = (None,)) -> None:
        """`scopes`: the namespaces the informers list (None: every namespace), one informer each."""
        self._lock = threading.Lock()
        self._by_job: dict[JobKey, dict[str, PodSummary]] = {}
        self._on_node: dict[str, dict[tuple[str, str], JobKey]] = {}
        """Node -> (namespace, pod name) -> the pod's job."""
        self._unlisted = set(scopes)
        """The scopes whose first listing has not ended yet."""
        self._all_listed = threading.Event()
        self._listings: dict[str | None, _Listing] = {}
        """Per scope, the listing under way."""
        self._unready: set[str] = set()
        self._signals: dict[str, NodeSignal | None] = {}
        """Every node seen, with the loss it last announced (None: none)."""

    # --- the informers ----------------------------------------------------------------------------
    def listing_began(self, scope: str | None) -> None:
        with self._lock:
            self._listings[scope] = _Listing()

    def listed(self, scope: str | None, pod: Mapping[str, Any]) -> None:
        """A pod of the listing under way in `scope`."""
        summarized = _summarized(pod)
        if summarized is None:
            return
        pod_summary, key, name = summarized
        with self._lock:
            listing = self._listings[scope]
            listing.seen.add((key, name))
            if (key, name) not in listing.changed:  # (the operator deleted it since the page was taken)
                self._forget(key, name)
                self._remember(key, name, pod_summary)

    def listing_ended(self, scope: str | None) -> None:
        """What the listing of `scope` did not bring (and no one changed since it began) is gone."""
        with self._lock:
            listing = self._listings.pop(scope)
            known = listing.seen | listing.changed
            for key, pods in list(self._by_job.items()):
                if scope is not None and key[0] != scope:
                    continue
                for name in [n for n in pods if (key, n) not in known]:
                    self._forget(key, name)
            self._unlisted.discard(scope)
            if not self._unlisted:
                self._all_listed.set()

    def observe(self, event_type: str, pod: Mapping[str, Any]) -> None:
        """A pod's watch event (DELETED: the pod is gone)."""
        summarized = _summarized(pod)
        if summarized is None:
            return
        pod_summary, key, name = summarized
        with self._lock:
            self._changed(key, name)
            if event_type == "DELETED":
                stored = self._by_job.get(key, {}).get(name)
                if stored is not None and stored["metadata"]["uid"] in (pod_summary["metadata"]["uid"], None):
                    self._forget(key, name)  # (a late event of an earlier pod of the name is not)
                return
            self._forget(key, name)
            self._remember(key, name, pod_summary)

    def deleted(self, namespace: str, job: str, name: str, uid: str | None) -> None:
        """The operator deleted this pod (`uid`) itself: as its DELETED event will say. Until then, a
        listing's page taken before the delete must not bring it back."""
        key = (namespace, job)
        with self._lock:
            self._changed(key, name)
            stored = self._by_job.get(key, {}).get(name)
            if stored is not None and stored["metadata"]["uid"] in (uid, None):
                self._forget(key, name)

    # --- the handlers -----------------------------------------------------------------------------
    def listed_once(self, timeout: float | None = None) -> bool:
        """Whether every scope's first listing has ended (waiting up to `timeout` for it)."""
        return self._all_listed.wait(timeout)

    def pods(self, namespace: str, job: str, timeout: float | None = None) -> list[PodSummary]:
        """The job's pods, once the first listings have ended (NotListedYet after `timeout`)."""
        if not self._all_listed.wait(timeout):
            raise NotListedYet(f"the pods are still being listed (job {namespace}/{job} waits for them)")
        with self._lock:
            return list(self._by_job.get((namespace, job), {}).values())

    def latest(self, pod: PodSummary) -> PodSummary | None:
        """The store's latest summary of the pod `pod` summarizes (the same uid); None once gone."""
        metadata = pod["metadata"]
        key = (metadata["namespace"], metadata["labels"].get(LABEL_JOB))
        with self._lock:
            stored = self._by_job.get(key, {}).get(metadata["name"])
        return stored if stored is not None and stored["metadata"]["uid"] == metadata["uid"] else None

    def forget_job(self, namespace: str, job: str) -> None:
        """The job is gone: drop its pods."""
        key = (namespace, job)
        with self._lock:
            for name in list(self._by_job.get(key, {})):
                self._forget(key, name)
            self._by_job.pop(key, None)

    def placed(self) -> list[tuple[str, str | None]]:
        """(namespace, phase) of every job pod held (the operator's metrics count them by phase)."""
        with self._lock:
            return [
                (namespace, pod_summary["status"]["phase"])
                for (namespace, _), pods in self._by_job.items()
                for pod_summary in pods.values()
            ]

    def observe_node(self, node: Mapping[str, Any]) -> bool:
        """A node's watch event; True when the node is NotReady."""
        name = str((node.get("metadata") or {}).get("name"))
        not_ready = node_not_ready(node)
        with self._lock:
            (self._unready.add if not_ready else self._unready.discard)(name)
        return not_ready

    def observe_signal(self, name: str, signal: NodeSignal | None) -> NodeSignal | None:
        """Record the loss node `name` announces now; the one it announced before (None: none, or the
        node was not seen yet)."""
        with self._lock:
            previous = self._signals.get(name)
            self._signals[name] = signal
        return previous

    def forget_node(self, name: str) -> None:
        """The node is gone (its DELETED event): what it announced goes with it."""
        with self._lock:
            self._signals.pop(name, None)

    def node_signal(self, name: str | None) -> tuple[bool, NodeSignal | None]:
        """(seen, the loss it announces): whether the node was seen, and what it announced last."""
        with self._lock:
            if name is None or name not in self._signals:
                return False, None
            return True, self._signals[name]

    def announcing(self) -> list[str]:
        """The nodes that announce a loss now (a maintenance, a termination), sorted."""
        with self._lock:
            return sorted(name for name, signal in self._signals.items() if signal is not None)

    def node_ready(self, name: str | None) -> bool:
        """False for a node last seen NotReady (unknown nodes and unbound pods are not judged)."""
        with self._lock:
            return name not in self._unready

    def pods_on(self, node: str) -> list[tuple[str, str]]:
        """(namespace, pod name) of the job pods bound to `node`."""
        with self._lock:
            return sorted(self._on_node.get(node, ()))

    def summaries_on(self, node: str) -> list[PodSummary]:
        """The summaries of the job pods bound to `node`, by namespace and name."""
        with self._lock:
            placed = sorted(self._on_node.get(node, {}).items())
            return [self._by_job[job][name] for (_, name), job in placed]

    def _changed(self, key: JobKey, name: str) -> None:
        for listing in self._listings.values():
            listing.changed.add((key, name))

    def _remember(self, key: JobKey, name: str, pod_summary: PodSummary) -> None:
        self._by_job.setdefault(key, {})[name] = pod_summary
        node = pod_summary["spec"]["nodeName"]
        if node:
            self._on_node.setdefault(node, {})[(key[0], name)] = key

    def _forget(self, key: JobKey, name: str) -> None:
        old = self._by_job.get(key, {}).pop(name, None)
        node = old["spec"]["nodeName"] if old else None
        if node:
            pods = self._on_node.get(node, {})
            pods.pop((key[0], name), None)
            if not pods:
                self._on_node.pop(node, None)
