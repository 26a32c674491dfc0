"""What the operator knows of its pods and nodes, kept in its own memory from the watch events.

Why not kopf indexes: kopf (1.45.2) runs no handler before every index is filled, and fills them with
every worker waiting on one toggle set that wakes them all on each indexed object. For a restarted
operator that is quadratic in the pods: 4,000 hosts took 92 s to be served again, 25,000 were not
within 5 minutes (benchmarks/operator_scale.py; 40 s with this store). So the handlers keep this
store instead:

- the pod event handler `observe`s every job pod (the watch's first listing included); a pod is kept
  as a small summary (`summary`), so a 25,000-host job costs megabytes, not the 100 MB of its JSON;
- a job's pods are read with `pods(namespace, job, list_pods)`: the first read of a job lists its pods
  from the API server, a page at a time (the watch may not have delivered them yet when a restarted
  operator resumes the job), and merges them in. What a watch event said wins over what a listing
  said: a listing is never newer than the events that followed it, and a pod deleted meanwhile is
  remembered until the listing is merged, so it is not brought back;
- the node event handler records which nodes are NotReady (`observe_node`); `pods_on(node)` are the
  job pods bound to a node.

Thread-safe: the event handlers call it on kopf's event loop, the job handlers (sync) from kopf's
thread pool. The listing runs outside the data lock, so the event loop never waits for the API
server, only, once per job, for the merge of its listing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from slicekeeper.operator.render import GROUP, LABEL_JOB

logger = logging.getLogger(__name__)

PodSummary = dict[str, Any]
JobKey = tuple[str, str]
"""(namespace, job name)."""


def summary(pod: Mapping[str, Any]) -> PodSummary:
    """What the operator reads of a pod (name, labels, our annotations, node, phase, scheduling), in the
    shape of the pod, so that the status derivation and hot-swap read a summary as they would a pod."""
    metadata = pod.get("metadata") or {}
    annotations = {k: v for k, v in (metadata.get("annotations") or {}).items() if k.startswith(GROUP)}
    status = pod.get("status") or {}
    scheduling = [c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"]
    return {
        "metadata": {
            "name": metadata.get("name"),
            "namespace": metadata.get("namespace"),
            "labels": dict(metadata.get("labels") or {}),
            "annotations": annotations,
        },
        "spec": {"nodeName": (pod.get("spec") or {}).get("nodeName")},
        "status": {"phase": status.get("phase"), "conditions": scheduling},
    }


def node_not_ready(node: Mapping[str, Any]) -> bool:
    """A node whose Ready condition is there and not True (no condition yet: not judged)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    return ready is not None and ready.get("status") != "True"


class PodStore:
    """Job pods by job and by node, and the NotReady nodes, as the watch events last described them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listing = threading.Lock()  # one listing at a time: a job is listed once
        self._by_job: dict[JobKey, dict[str, PodSummary]] = {}
        self._on_node: dict[str, set[tuple[str, str]]] = {}
        self._listed: set[JobKey] = set()
        self._observed: dict[JobKey, set[str]] = {}
        """Per job still to be listed: the pods an event described (added, changed or deleted)."""
        self._unready: set[str] = set()

    def observe(self, event_type: str | None, pod: Mapping[str, Any]) -> None:
        """A pod's watch event (None: the watch's first listing; DELETED: the pod is gone)."""
        pod_summary = summary(pod)
        metadata = pod_summary["metadata"]
        job = metadata["labels"].get(LABEL_JOB)
        if job is None:
            return
        key, name = (str(metadata["namespace"]), str(job)), str(metadata["name"])
        with self._lock:
            if key not in self._listed:
                self._observed.setdefault(key, set()).add(name)
            self._forget(key, name)
            if event_type != "DELETED":
                self._remember(key, name, pod_summary)

    def pods(
        self, namespace: str, job: str, list_pods: Callable[[], Iterable[Mapping[str, Any]]]
    ) -> list[PodSummary]:
        """The job's pods; the first call for a job lists them with `list_pods` and merges them in."""
        key = (namespace, job)
        if key not in self._listed:
            with self._listing:
                if key not in self._listed:
                    started = time.monotonic()
                    listed = [summary(pod) for pod in list_pods()]
                    self._merge(key, listed)
                    logger.info(
                        "read the %d pods of job %s/%s from the API server in %.1f s",
                        len(listed),
                        namespace,
                        job,
                        time.monotonic() - started,
                    )
        with self._lock:
            return list(self._by_job.get(key, {}).values())

    def forget_job(self, namespace: str, job: str) -> None:
        """The job is gone: drop its pods. It stays listed: the watch has been on since, so the events
        alone describe a job created again under its name (and nothing piles up in `_observed`)."""
        key = (namespace, job)
        with self._lock:
            for name in list(self._by_job.get(key, {})):
                self._forget(key, name)
            self._by_job.pop(key, None)
            self._observed.pop(key, None)
            self._listed.add(key)

    def observe_node(self, node: Mapping[str, Any]) -> bool:
        """A node's watch event; True when the node is NotReady."""
        name = str((node.get("metadata") or {}).get("name"))
        not_ready = node_not_ready(node)
        with self._lock:
            (self._unready.add if not_ready else self._unready.discard)(name)
        return not_ready

    def node_ready(self, name: str | None) -> bool:
        """False for a node last seen NotReady (unknown nodes and unbound pods are not judged)."""
        with self._lock:
            return name not in self._unready

    def pods_on(self, node: str) -> list[tuple[str, str]]:
        """(namespace, pod name) of the job pods bound to `node`."""
        with self._lock:
            return sorted(self._on_node.get(node, ()))

    def _merge(self, key: JobKey, listed: list[PodSummary]) -> None:
        with self._lock:
            observed = self._observed.pop(key, set())
            for pod_summary in listed:
                name = str(pod_summary["metadata"]["name"])
                if name not in observed:  # an event said more recently what became of it
                    self._remember(key, name, pod_summary)
            self._listed.add(key)

    def _remember(self, key: JobKey, name: str, pod_summary: PodSummary) -> None:
        self._by_job.setdefault(key, {})[name] = pod_summary
        node = pod_summary["spec"]["nodeName"]
        if node:
            self._on_node.setdefault(node, set()).add((key[0], name))

    def _forget(self, key: JobKey, name: str) -> None:
        old = self._by_job.get(key, {}).pop(name, None)
        node = old["spec"]["nodeName"] if old else None
        if node:
            pods = self._on_node.get(node, set())
            pods.discard((key[0], name))
            if not pods:
                self._on_node.pop(node, None)
