"""What the operator knows of its pods and nodes, kept in its own memory from the watch events.

Why not kopf indexes: kopf (1.45.2) runs no handler before every index is filled, and fills them with
every worker waiting on one toggle set that wakes them all on each indexed object. For a restarted
operator that is quadratic in the pods: 4,000 hosts took 92 s to be served again, 25,000 were not
within 5 minutes (benchmarks/operator_scale.py; 40 s with this store). So the handlers keep this
store instead:

- the pod event handler `observe`s every job pod (the watch's listings included); a pod is kept as a
  small summary (`summary`), so a 25,000-host job costs megabytes, not the 100 MB of its JSON;
- a job's pods are read with `pods(namespace, job, list_pods)`: the first read of a job lists its pods
  from the API server, a page at a time (the watch may not have delivered them yet when a restarted
  operator resumes the job), and merges them in. What a watch event said wins over what a listing
  said: a listing is never newer than the events that followed it, and a pod deleted meanwhile is
  remembered until the listing is merged, so it is not brought back;
- the node event handler records which nodes are NotReady (`observe_node`) and the loss each node
  announces (`observe_signal`, operator/notices.py); `pods_on(node)` are the job pods bound to a
  node, `summaries_on(node)` the same as summaries.

Watch gaps. The API server ends watches, and answers one that resumes from a resourceVersion it no
longer holds with 410 Gone; kopf then lists the pods again and hands each one to the event handler as
an event of type None (as in its first listing). A pod deleted during the gap is simply not in that
listing: kopf says nothing of it, and nothing tells a handler where a listing starts or ends. So:

- a listing event (type None) for a pod the watch has described before is the sign that kopf listed
  again (in one listing each pod comes once); then every job is listed again from the API server at
  its next read, and a pod the new listing lacks is dropped (unless an event described it since);
- when no pod the watch knew is left to show the re-list (every job pod in the watched namespaces
  went during the gap), `verify` notices: the job's timer asks the API server about one of the job's
  pods in turn, and a pod the server does not have (or has as another pod, a new uid) makes the next
  read list the job again.

Thread-safe: the event handlers call it on kopf's event loop, the job handlers (sync) from kopf's
thread pool. The listing runs outside the data lock, so the event loop never waits for the API
server, only, once per job and re-list, for the merge of its listing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from slicekeeper.operator.notices import NodeSignal
from slicekeeper.operator.render import GROUP, LABEL_JOB

logger = logging.getLogger(__name__)

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


def node_not_ready(node: Mapping[str, Any]) -> bool:
    """A node whose Ready condition is there and not True (no condition yet: not judged)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    return ready is not None and ready.get("status") != "True"


class PodStore:
    """Job pods by job and by node, the NotReady nodes and the losses nodes announce, as the watch events
    last described them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listing = threading.Lock()  # one listing at a time: a job is listed once per re-list
        self._by_job: dict[JobKey, dict[str, PodSummary]] = {}
        self._on_node: dict[str, dict[tuple[str, str], JobKey]] = {}
        """Node -> (namespace, pod name) -> the pod's job."""
        self._relists = 0
        """Re-lists of kopf's pod watch noticed so far (its first listing not counted)."""
        self._listed: dict[JobKey, int] = {}
        """Per job: the re-list count its last listing was made under (older: list it again)."""
        self._observed: dict[JobKey, set[str]] = {}
        """Per job to be listed: the pods an event described (added, changed or deleted) since."""
        self._described: dict[str, int] = {}
        """Job pod uid -> the re-list count when the watch last described it."""
        self._verify_next: dict[JobKey, int] = {}
        self._unready: set[str] = set()
        self._signals: dict[str, NodeSignal | None] = {}
        """Every node seen, with the loss it last announced (None: none)."""

    def observe(self, event_type: str | None, pod: Mapping[str, Any]) -> None:
        """A pod's watch event (None: one of the watch's listings; DELETED: the pod is gone)."""
        pod_summary = summary(pod)
        metadata = pod_summary["metadata"]
        job = metadata["labels"].get(LABEL_JOB)
        if job is None:
            return
        key, name, uid = (str(metadata["namespace"]), str(job)), str(metadata["name"]), metadata["uid"]
        with self._lock:
            if event_type is None and self._described.get(uid, -1) >= self._relists:
                self._relists += 1  # this pod was described before: kopf is listing again
                logger.info("the pod watch listed again: every job is listed again at its next read")
            if self._stale(key):
                self._observed.setdefault(key, set()).add(name)
            stored = self._by_job.get(key, {}).get(name)
            if event_type == "DELETED":
                self._described.pop(uid, None)
                if stored is None or stored["metadata"]["uid"] in (uid, None):
                    self._forget(key, name)  # (a late event of an earlier pod of the name is not)
                return
            self._described[uid] = self._relists
            self._forget(key, name)
            self._remember(key, name, pod_summary)

    def deleted(self, namespace: str, job: str, name: str, uid: str | None) -> None:
        """The operator deleted this pod (`uid`) itself: as its DELETED event will say, or would have.
        A delete made while kopf's listing is under way may fall between the listing's snapshot and
        the watch that follows it, and no event ever tells of it."""
        key = (namespace, job)
        with self._lock:
            if self._stale(key):
                self._observed.setdefault(key, set()).add(name)
            stored = self._by_job.get(key, {}).get(name)
            if uid is not None:
                self._described.pop(uid, None)
            if stored is not None and stored["metadata"]["uid"] in (uid, None):
                self._forget(key, name)

    def pods(
        self, namespace: str, job: str, list_pods: Callable[[], Iterable[Mapping[str, Any]]]
    ) -> list[PodSummary]:
        """The job's pods; the first call for a job, and the first after a re-list of the watch, lists
        them with `list_pods` and merges them in."""
        key = (namespace, job)
        if self._stale(key):
            with self._listing:
                with self._lock:
                    relists = self._relists
                if self._stale(key):
                    started = time.monotonic()
                    listed = [summary(pod) for pod in list_pods()]
                    self._merge(key, listed, relists)
                    logger.info(
                        "read the %d pods of job %s/%s from the API server in %.1f s",
                        len(listed),
                        namespace,
                        job,
                        time.monotonic() - started,
                    )
        with self._lock:
            return list(self._by_job.get(key, {}).values())

    def verify(self, namespace: str, job: str, server_uid: Callable[[str], str | None]) -> bool:
        """Ask the API server about one of the job's pods (in turn: `server_uid(name)` is its uid
        there, None when there is none). False when the store was wrong about it: the job is then
        listed again at its next read."""
        key = (namespace, job)
        with self._lock:
            known = self._by_job.get(key, {})
            if not known:
                return True
            turn = self._verify_next.get(key, 0) % len(known)
            self._verify_next[key] = turn + 1
            name = list(known)[turn]
            pod_summary = known[name]
        uid = server_uid(name)
        if uid == pod_summary["metadata"]["uid"]:
            return True
        with self._lock:
            if self._by_job.get(key, {}).get(name) is pod_summary:  # no event said more meanwhile
                logger.info(
                    "pod %s/%s is not what the API server has: job %s is listed again", namespace, name, job
                )
                self._listed.pop(key, None)
                return False
        return True

    def forget_job(self, namespace: str, job: str) -> None:
        """The job is gone: drop its pods. It stays listed: the watch has been on since, so the events
        alone describe a job created again under its name (and nothing piles up in `_observed`)."""
        key = (namespace, job)
        with self._lock:
            for name, pod_summary in list(self._by_job.get(key, {}).items()):
                self._described.pop(pod_summary["metadata"]["uid"], None)
                self._forget(key, name)
            self._by_job.pop(key, None)
            self._observed.pop(key, None)
            self._verify_next.pop(key, None)
            self._listed[key] = self._relists

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

    def _stale(self, key: JobKey) -> bool:
        """The job has not been listed since the watch last listed again (or ever)."""
        return self._listed.get(key, -1) < self._relists

    def _merge(self, key: JobKey, listed: list[PodSummary], relists: int) -> None:
        """The listing is the job's pods, except where an event said more recently what became of
        one; a pod no event described and the listing lacks went while the watch could not say so."""
        with self._lock:
            observed = self._observed.pop(key, set())
            names = set()
            for pod_summary in listed:
                name = str(pod_summary["metadata"]["name"])
                names.add(name)
                if name not in observed:
                    self._forget(key, name)
                    self._remember(key, name, pod_summary)
            for name, pod_summary in list(self._by_job.get(key, {}).items()):
                if name not in names and name not in observed:
                    self._described.pop(pod_summary["metadata"]["uid"], None)
                    self._forget(key, name)
            self._listed[key] = relists

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
