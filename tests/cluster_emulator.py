"""An emulated Kubernetes API server for the operator's tests: kmock's KubernetesEmulator, plus what
the operator needs and kmock leaves out (REFERENCES sec. 2).

Added here: a `uid`, `creationTimestamp` and `generation` on every created object (owner references
need the uid); a `resourceVersion` bumped by every write, which lists report and watches start from
(kopf's JSON patches test it; a stale one is refused with 422, as Kubernetes does); label selectors
on lists (`key=value`, `key!=value`, `key`, `!key`, comma-joined); pages of lists (`limit` and
`continue`, each list a snapshot, as Kubernetes serves them); `generateName`; `live()` to read
objects back.
Nodes and pods are played by the test harness (tests/operator/harness.py).

Two of kmock's costs grow with what it has served, which a 25,000-pod job (the scale benchmark,
benchmarks/operator_scale.py) makes quadratic; both are replaced by equivalents that do not walk
everything: the choice of a reaction for a request (`_DirectDispatch`), and the lookup of the one
object a fetch, create, patch or delete names (one dict lookup instead of a walk of every object).
"""

from __future__ import annotations

import contextlib
import datetime
import uuid
from collections.abc import AsyncIterator
from typing import Any

import jsonpatch
from kmock import KubernetesEmulator, KubernetesError, resource
from kmock._internal import dsl, enums, k8s_dicts, rendering
from kmock._internal.apps import RawHandler

TRAININGJOBS = "slicekeeper.dev/v1alpha1/trainingjobs"


def matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _reaches(view: dsl.View, request: rendering.Request) -> bool:
    """`request in view` (kmock's own test) for a request just logged, without walking the log.

    kmock answers it by iterating every request the view has ever seen (the root's whole log,
    through the view's filters) until it meets this one, the newest. For the chains of priorities
    and filters the emulator's reactions are made of, the answer is: the request passes each
    filter's criteria and is in the root's log (found from its end). Any other view is asked as
    kmock asks it.
    """
    while True:
        if type(view) is dsl.Priority:
            view = view._source
        elif type(view) is dsl.Filter:
            if not view.criteria(request):
                return False
            view = view._source
        elif isinstance(view, dsl.Root) and type(view).__iter__ is dsl.Root.__iter__:
            return any(logged is request for logged in reversed(view._requests))
        else:
            return request in view


class _DirectDispatch(RawHandler):  # type: ignore[misc]
    """kmock 0.8's `RawHandler._handle` (the choice of the reaction that serves a request), the same
    but for its test `request in payload._source`, answered by `_reaches`. kmock's test costs a walk
    of the whole request log per reaction tried, per request: quadratic over a run, most of the
    emulator's time from about a thousand pods on."""

    __slots__ = ()

    async def _handle(self, request: rendering.Request) -> Any:
        priorities: list[tuple[float, ...]] = [payload.priorities for payload in self._payloads]
        max_length: int = max(len(priority) for priority in priorities) if priorities else 0
        priorities = [tuple(-p for p in priority) for priority in priorities]  # reverse-sort
        priorities = [priority + (0,) * (max_length - len(priority)) for priority in priorities]
        indexes = sorted(range(len(priorities)), key=lambda index: priorities[index])
        payloads = [self._payloads[index] for index in indexes]
        for payload in payloads:
            if _reaches(payload._source, request) and not payload._disabled.is_set():
                try:
                    return await payload(request)
                except rendering.ReactionMismatchError:  # either mismatch or depletion
                    payload._disabled.set()
                except NotImplementedError:  # matched, but non-actionable (nothing to respond with)
                    pass
        raise NotImplementedError(
            "Undefined server behaviour: no reaction matching the request is defined. "
            "Consider adding a catch-all fallback reaction: `kmock.fallback << 404`."
        )


class ClusterEmulator(KubernetesEmulator, _DirectDispatch):  # type: ignore[misc]
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.resources.load_bundled()
        self.resources[TRAININGJOBS] = {
            "kind": "TrainingJob",
            "namespaced": True,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
            "subresources": ["status"],
        }
        self._unlisted: dict[str, list[Any]] = {}  # continue token -> the rest of a paged list

    _latest = 0

    async def _handle(self, request: rendering.Request) -> Any:
        self._latest += 1
        version = str(self._latest)
        if request.action == enums.action.UPDATE and isinstance(request.data, list):  # a JSON patch
            request.data.append({"op": "add", "path": "/metadata/resourceVersion", "value": version})
        elif request.action == enums.action.UPDATE and isinstance(request.data, dict):  # a merge patch
            request.data.setdefault("metadata", {})["resourceVersion"] = version
        if request.action == enums.action.CREATE and isinstance(request.data, dict):
            metadata = request.data.setdefault("metadata", {})
            metadata["resourceVersion"] = version
            if "name" not in metadata and "generateName" in metadata:  # e.g. kopf's events
                metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:5]
            metadata.setdefault("uid", str(uuid.uuid4()))
            metadata.setdefault("generation", 1)
            metadata.setdefault(
                "creationTimestamp", datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            )
            if request.namespace and "namespace" not in metadata:
                metadata["namespace"] = request.namespace
        try:
            return await super()._handle(request)
        except jsonpatch.JsonPatchTestFailed as error:  # a stale resourceVersion: 422, as Kubernetes says
            raise KubernetesError(status=422, reason="Invalid", message=str(error)) from None

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[Any]:
        """A watch from a list's resourceVersion streams only what changed after it (kmock replays
        every object first, which a watcher would take for a second, stale copy)."""
        since = request.params.get("resourceVersion", "")
        since_version = int(since) if since.isdigit() else 0
        # aclosing: a watcher that goes away must unsubscribe from kmock's bus at once, or the next
        # write waits for it forever.
        async with contextlib.aclosing(super()._serve_watch(request)) as events:
            async for event in events:
                if isinstance(event, dict) and event.get("type") == "ADDED":
                    version = event.get("object", {}).get("metadata", {}).get("resourceVersion", "")
                    if version.isdigit() and int(version) <= since_version:
                        continue
                yield event

    def _KubernetesEmulator__get_obj(  # kmock's private lookup of the one object a request names
        self, request: rendering.Request, strict: bool
    ) -> k8s_dicts.Object | None:
        """The object a fetch, create, patch or delete names: kmock walks every object to find it
        (strictly: same resource, namespace and name); with a name, that is one dict lookup."""
        if strict and request.resource is not None and request.name is not None:
            key = (request.resource, request.namespace, request.name)
            if key not in self._objects:  # kmock's ObjectsArray has no get()
                return None
            return self._objects[key]
        found: k8s_dicts.Object | None = super()._KubernetesEmulator__get_obj(request, strict)  # type: ignore[misc]
        return found

    async def _serve_list(self, request: rendering.Request) -> Any:
        listed = await super()._serve_list(request)
        if isinstance(listed, dict):
            listed["metadata"] = {"resourceVersion": str(self._latest)}
        selector = request.params.get("labelSelector")
        if selector and isinstance(listed, dict):
            listed["items"] = [
                item
                for item in listed["items"]
                if matches(item.get("metadata", {}).get("labels") or {}, selector)
            ]
        limit = request.params.get("limit", "")
        token = request.params.get("continue")
        if isinstance(listed, dict) and (token or (limit.isdigit() and int(limit) > 0)):
            self._page(listed, int(limit) if limit.isdigit() else 0, token)
        return listed

    def _page(self, listed: dict[str, Any], limit: int, token: str | None) -> None:
        """Cut `listed` to one page: the first of a snapshot of its items, or the next of the snapshot
        `token` names (410 Gone when there is none); `metadata.continue` names the rest, if any."""
        if token:
            if token not in self._unlisted:
                raise KubernetesError(status=410, reason="Expired", message=f"no list continues at {token}")
            items = self._unlisted.pop(token)
        else:
            items = listed["items"]
        limit = limit if limit > 0 else len(items)
        listed["items"], rest = items[:limit], items[limit:]
        if rest:
            following = uuid.uuid4().hex
            self._unlisted[following] = rest
            listed["metadata"]["continue"] = following
            listed["metadata"]["remainingItemCount"] = len(rest)

    # --- for the harness and the assertions ----------------------------------------------------
    def live(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        found = []
        for (res, ns, _name), obj in list(self.objects.items()):
            if res == resource(plural) and not obj.deleted and (namespace is None or ns == namespace):
                found.append(dict(obj.raw))
        return found
