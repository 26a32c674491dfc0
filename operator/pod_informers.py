"""The jobs' pods as the operator follows them: an informer per namespace it serves (operator/
informer.py), feeding the pod store (operator/pod_store.py) and asking the handlers what each pod's
event asks of the operator.

The informer's thread only decides (in memory: the pod's job, whether it failed, whether its hot-swap
has begun); what must be done (the API calls of a hot-swap, or of failing the job) runs in a pool of
`ACTION_THREADS` threads, so that a slow API server never holds up the pods' events.

An action that fails (its requests' own retries spent: an API server down for longer than they wait)
is decided again and tried again after `RETRY_SECONDS`, doubling up to `RETRY_MAX_SECONDS`, for as
long as the pod's event is the latest one heard of: a newer event of the pod brings its own decision,
and the old one is dropped (as client-go's controllers requeue a failed key with a rate-limited
backoff). A failed pod whose hot-swap failed would otherwise wait for an event that may never come.

The informers start with the first job handler (`start`): kopf runs none before its index of the
jobs is filled, and a pod's job is looked up there.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from slicekeeper.operator.cluster import Cluster
from slicekeeper.operator.informer import Informer
from slicekeeper.operator.pod_store import PodStore
from slicekeeper.operator.render import LABEL_JOB

logger = logging.getLogger(__name__)

ACTION_THREADS = 8
"""Pod events acted on at once (each a hot-swap's few requests, or a job's failure)."""
RETRY_SECONDS = 1.0
RETRY_MAX_SECONDS = 30.0
Action = Callable[[], None]
React = Callable[[str | None, dict[str, Any]], Action | None]
"""What a pod's event (its type; None: one of a listing's pods) asks of the operator, if anything."""
PodKey = tuple[str, str]


class _ScopeSink:
    """An informer's sink: the store first, then what the pod asks of the operator."""

    def __init__(
        self, scope: str | None, store: PodStore, on_event: Callable[[str | None, dict[str, Any]], None]
    ) -> None:
        self._scope, self._store, self._on_event = scope, store, on_event

    def listing_began(self) -> None:
        self._store.listing_began(self._scope)

    def listed(self, obj: dict[str, Any]) -> None:
        self._store.listed(self._scope, obj)
        self._on_event(None, obj)

    def listing_ended(self) -> None:
        self._store.listing_ended(self._scope)

    def changed(self, event_type: str, obj: dict[str, Any]) -> None:
        self._store.observe(event_type, obj)
        self._on_event(event_type, obj)


class PodInformers:
    """The informers of the jobs' pods in `scopes` (namespaces; None: every namespace)."""

    def __init__(self, cluster: Cluster, store: PodStore, scopes: Sequence[str | None], react: React) -> None:
        self._cluster, self._store, self._scopes, self._react = cluster, store, list(scopes), react
        self._lock = threading.Lock()
        self._informers: list[Informer] = []
        self._actions: ThreadPoolExecutor | None = None
        self._stopped = False
        self._heard: dict[PodKey, int] = {}
        """Per pod: how many of its events were heard (a retry of an older one's action is dropped)."""
        self.retries = 0
        """Actions tried again so far."""

    def start(self) -> None:
        """Start the informers (only the first call does anything)."""
        with self._lock:
            if self._informers or self._stopped:
                return
            self._actions = ThreadPoolExecutor(ACTION_THREADS, thread_name_prefix="pod-actions")
            for scope in self._scopes:
                informer = Informer(
                    f"job pods in {scope or 'every namespace'}",
                    partial(self._cluster.pod_pages, scope, LABEL_JOB),
                    partial(self._cluster.watch_pods, scope, LABEL_JOB),
                    _ScopeSink(scope, self._store, self._on_event),
                )
                self._informers.append(informer)
                informer.start()

    def stop(self) -> None:
        """Stop following the pods; the actions not begun are dropped (a restarted operator's
        listing finds what they were for)."""
        with self._lock:
            self._stopped = True
            informers, self._informers = self._informers, []
            actions, self._actions = self._actions, None
        for informer in informers:
            informer.stop()
        if actions is not None:
            actions.shutdown(wait=False, cancel_futures=True)

    def _on_event(self, event_type: str | None, obj: dict[str, Any]) -> None:
        """A pod's event: the newest word on the pod (a failed action of an older one is not retried)."""
        key = _key(obj)
        with self._lock:
            heard = self._heard[key] = self._heard.get(key, 0) + 1
        self._decide(event_type, obj, heard, RETRY_SECONDS)

    def _decide(self, event_type: str | None, obj: dict[str, Any], heard: int, backoff: float) -> None:
        action = self._react(event_type, obj)
        actions = self._actions
        if action is None or actions is None:
            return
        with contextlib.suppress(RuntimeError):  # (shut down meanwhile)
            actions.submit(self._run, action, (event_type, obj, heard), backoff)

    def _run(self, action: Action, event: tuple[str | None, dict[str, Any], int], backoff: float) -> None:
        try:
            action()
        except Exception as error:
            if self._stopped:
                return
            logger.warning(
                "pod %s/%s: acting on its event failed (%s); deciding again in %.0f s",
                *_key(event[1]),
                error,
                backoff,
            )
            retry = threading.Timer(backoff, self._retry, (event, backoff))
            retry.daemon = True
            retry.start()

    def _retry(self, event: tuple[str | None, dict[str, Any], int], backoff: float) -> None:
        event_type, obj, heard = event
        with self._lock:
            if self._stopped or self._heard.get(_key(obj)) != heard:
                return  # a newer event of the pod was decided on since
            self.retries += 1
        self._decide(event_type, obj, heard, min(backoff * 2, RETRY_MAX_SECONDS))


def _key(obj: dict[str, Any]) -> PodKey:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("namespace")), str(metadata.get("name"))
