"""An emulated Kubernetes API server for the operator's tests: kmock's KubernetesEmulator, plus what
the operator needs and kmock leaves out (REFERENCES sec. 2).

Added here: a `uid`, `creationTimestamp` and `generation` on every created object (owner references
need the uid); a `resourceVersion` bumped by every write, which lists report and watches start from
(kopf's JSON patches test it; a stale one is refused with 422, as Kubernetes does); label selectors
on lists (`key=value`, `key!=value`, `key`, `!key`, comma-joined); `generateName`; `live()` to
read objects back.
Nodes and pods are played by the test harness (tests/operator/harness.py).
"""

from __future__ import annotations

import contextlib
import datetime
import uuid
from collections.abc import AsyncIterator
from typing import Any

import jsonpatch
from kmock import KubernetesEmulator, KubernetesError, resource
from kmock._internal import enums, rendering

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


class ClusterEmulator(KubernetesEmulator):  # type: ignore[misc]
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.resources.load_bundled()
        self.resources[TRAININGJOBS] = {
            "kind": "TrainingJob",
            "namespaced": True,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
            "subresources": ["status"],
        }

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
        return listed

    # --- for the harness and the assertions ----------------------------------------------------
    def live(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        found = []
        for (res, ns, _name), obj in list(self.objects.items()):
            if res == resource(plural) and not obj.deleted and (namespace is None or ns == namespace):
                found.append(dict(obj.raw))
        return found
