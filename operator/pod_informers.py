"""The jobs' pods as the operator follows them: an informer per namespace it serves (operator/
informer.py), feeding the pod store (operator/pod_store.py) and asking the handlers what each pod's
event asks of the operator.

The informer's thread only decides (in memory: the pod's job, whether it failed, whether its hot-swap
has begun); what must be done (the API calls of a hot-swap, or of failing the job) runs in a pool of
`ACTION_THREADS` threads, so that a slow API server never holds up the pods' events. A failed action
is logged, and not tried again here: the job's timer finds what is still amiss (a pod missing, a
node NotReady), as it did when kopf delivered these events.

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
Action = Callable[[], None]
React = Callable[[str | None, dict[str, Any]], Action | None]
"""What a pod's event (its type; None: one of a listing's pods) asks of the operator, if anything."""


class _ScopeSink:
    """An informer's sink: the store first, then the handlers' `react`."""

    def __init__(
        self, scope: str | None, store: PodStore, react: React, act: Callable[[Action], None]
    ) -> None:
        self._scope, self._store, self._react, self._act = scope, store, react, act

    def listing_began(self) -> None:
        self._store.listing_began(self._scope)

    def listed(self, obj: dict[str, Any]) -> None:
        self._store.listed(self._scope, obj)
        self._act_on(None, obj)

    def listing_ended(self) -> None:
        self._store.listing_ended(self._scope)

    def changed(self, event_type: str, obj: dict[str, Any]) -> None:
        self._store.observe(event_type, obj)
        self._act_on(event_type, obj)

    def _act_on(self, event_type: str | None, obj: dict[str, Any]) -> None:
        action = self._react(event_type, obj)
        if action is not None:
            self._act(action)


class PodInformers:
    """The informers of the jobs' pods in `scopes` (namespaces; None: every namespace)."""

    def __init__(self, cluster: Cluster, store: PodStore, scopes: Sequence[str | None], react: React) -> None:
        self._cluster, self._store, self._scopes, self._react = cluster, store, list(scopes), react
        self._lock = threading.Lock()
        self._informers: list[Informer] = []
        self._actions: ThreadPoolExecutor | None = None
        self._stopped = False

    def start(self) -> None:
        """Start the informers (only the first call does anything)."""
        with self._lock:
            if self._informers or self._stopped:
                return
            self._actions = ThreadPoolExecutor(ACTION_THREADS, thread_name_prefix="pod-actions")
            for scope in self._scopes:
                sink = _ScopeSink(scope, self._store, self._react, self._act)
                informer = Informer(
                    f"job pods in {scope or 'every namespace'}",
                    partial(self._cluster.pod_pages, scope, LABEL_JOB),
                    partial(self._cluster.watch_pods, scope, LABEL_JOB),
                    sink,
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

    def _act(self, action: Action) -> None:
        actions = self._actions
        if actions is None:
            return
        with contextlib.suppress(RuntimeError):  # (shut down meanwhile)
            actions.submit(_logged, action)


def _logged(action: Action) -> None:
    try:
        action()
    except Exception:
        logger.exception("a pod event's action failed (the job's timer looks again)")
