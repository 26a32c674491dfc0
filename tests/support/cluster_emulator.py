"""An emulated Kubernetes API server for the operator's tests: kmock's KubernetesEmulator, made to
behave like a real API server where the operator depends on it (REFERENCES sec. 2 lists what kmock
leaves out).

Writes (create, patch, delete) are committed here, not by kmock, one at a time:

- every object gets a `uid`, `creationTimestamp` and `generation` (bumped when anything but metadata
  and status changes); every change gets the next `resourceVersion`, at commit time, so versions
  grow in the order changes happen; a write that changes nothing is no change (no new version, no
  watch event), as on a real API server;
- the status subresource: for a resource that has one (TrainingJobs, pods, nodes, Services), a
  write to the object ignores `status` and a write to `.../status` changes only `status`; a created
  object's status is what the API server makes it (pods `Pending`, nodes as registered, others none);
- patches: a JSON patch whose `test` fails (kopf tests `resourceVersion`) is refused with 422; a
  merge patch naming another `resourceVersion` with 409; a strategic merge patch of a custom resource
  with 415 (the API server has no patch strategy for it);
- TrainingJobs are pruned, defaulted and validated by the CRD's schema (`crds/trainingjob.yaml`,
  tests/support/structural_schema.py); an invalid one is refused with 422;
- deletion: an object with finalizers gets a `deletionTimestamp` and goes when the last finalizer
  does; the garbage collector then deletes its dependents (owner references, background
  propagation), and an object created for owners that are all gone is collected at once;
- watches: a watch from a `resourceVersion` replays the changes after it from the resource's history
  (the last `history_size` events); a version older than the history gets the watch event
  `ERROR 410 Gone` ("too old resource version"), upon which a client must list again. A watch ends
  after `watch_seconds` (or the client's `timeoutSeconds`) with a BOOKMARK of the newest version, as
  the API server's watch timeout ends it; `expire_watches` ends a resource's watches now, and
  `watch_gap` cuts them off for a while and compacts the history, so the watchers come back to 410;
- replace (PUT of a named object, as kubernetes' Lease lock renews a Lease): the body's
  `resourceVersion` must be the stored one (else 409 Conflict: the compare-and-swap leader election
  relies on); the object becomes the body, with what only the API server sets kept;
- lists: label selectors (`key=value`, `key!=value`, `key`, `!key`, comma-joined), pages (`limit`
  and `continue`, each list a snapshot, as Kubernetes serves them), the list's `resourceVersion`
  taken with its items; `generateName`.

Not emulated: field selectors, graceful pod deletion (a deleted pod goes at once), strategic merge of
lists by key (a strategic merge patch of a built-in resource merges like a merge patch), admission
webhooks, RBAC.

For the tests: `unavailable` makes it answer 503 to everything for a while (an API server
restarting); `faults` collects what went wrong inside the emulator itself (a bug here would
otherwise reach the clients as a 500 they retry), and the harness fails the test with it.

Two of kmock's costs grow with what it has served, which a 25,000-pod job (the scale benchmark,
benchmarks/operator_scale.py) makes quadratic; both are replaced by equivalents that do not walk
everything: the choice of a reaction for a request (`_DirectDispatch`), and the lookup of the one
object a fetch, patch or delete names (one dict lookup instead of a walk of every object).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import datetime
import itertools
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp.web
import jsonpatch
import jsonpointer
from kmock import KubernetesEmulator, KubernetesError, resource
from kmock._internal import dsl, enums, k8s_dicts, rendering
from kmock._internal.apps import RawHandler

from tests.support.structural_schema import StructuralSchema, crd_schema

TRAININGJOBS = "slicekeeper.dev/v1alpha1/trainingjobs"
PODS, NODES = resource("v1/pods"), resource("v1/nodes")
CRD_FILE = Path(__file__).resolve().parents[2] / "crds" / "trainingjob.yaml"
HISTORY_SIZE = 1000
"""Watch events kept per resource, to replay to a watch that resumes from a resourceVersion."""

ObjectKey = tuple[Any, str | None, str]
"""(kmock resource, namespace, name): how kmock keys its objects."""
WRITES = (enums.action.CREATE, enums.action.UPDATE, enums.action.DELETE)


def matches(labels: Mapping[str, str], selector: str) -> bool:
    """Whether `labels` satisfy a label selector's equality and existence terms."""
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


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _metadata(obj: Mapping[str, Any]) -> dict[str, Any]:
    metadata: dict[str, Any] = obj.get("metadata") or {}
    return metadata


def _content(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What `generation` counts changes of: everything but metadata and status."""
    return {key: value for key, value in obj.items() if key not in ("metadata", "status")}


@dataclass(frozen=True)
class _WatchEnd:
    """A bus item that ends watches of its resource: one (`watch`, its number) or all (None)."""

    watch: int | None
    bookmark: bool


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
        self.schemas: dict[Any, StructuralSchema] = {
            resource(TRAININGJOBS): StructuralSchema(crd_schema(CRD_FILE, "v1alpha1"))
        }
        self.watch_seconds: float | None = None
        """A watch ends after this long (None: only when the client or `expire_watches` ends it)."""
        self.history_size = HISTORY_SIZE
        self.unavailable = False
        """While True, every request is answered 503 (an API server restarting behind its balancer)."""
        self.faults: list[BaseException] = []
        self._latest = 0
        self._history: dict[Any, collections.deque[tuple[int, dict[str, Any]]]] = collections.defaultdict(
            collections.deque
        )
        self._compacted: dict[Any, int] = collections.defaultdict(int)
        """Per resource: the newest version the history no longer holds (older watches get 410)."""
        self._held: dict[Any, asyncio.Event] = {}
        self._watch_numbers = itertools.count()
        self._timers: set[asyncio.Task[None]] = set()
        self._unlisted: dict[str, list[Any]] = {}  # continue token -> the rest of a paged list
        self._by_uid: dict[str, ObjectKey] = {}
        self._dependents: dict[str, set[ObjectKey]] = collections.defaultdict(set)
        """Owner uid -> the objects whose ownerReferences name it."""

    # --- requests -------------------------------------------------------------------------------
    async def _handle(self, request: rendering.Request) -> Any:
        """Commit a write, then let kmock's reactions answer (they read the committed object back)."""
        if self.unavailable:
            raise KubernetesError(
                status=503, reason="ServiceUnavailable", message="the API server is restarting"
            )
        if request.method == enums.method.PUT and request.resource is not None and request.name is not None:
            async with self._lock:
                return aiohttp.web.json_response(await self._replace(request))
        created: ObjectKey | None = None
        if request.resource is not None and request.action in WRITES:
            try:
                async with self._lock:
                    created = await self._commit(request)
            except KubernetesError:
                raise
            except Exception as error:  # a bug in the emulator: the test must hear of it
                self.faults.append(error)
                raise
        try:
            return await _DirectDispatch._handle(self, request)
        finally:
            if created is not None:
                async with self._lock:
                    await self._collect_if_orphaned(created)

    async def _commit(self, request: rendering.Request) -> ObjectKey | None:
        """Apply a write to the stored objects; the key of an object created."""
        res = request.resource
        if request.action == enums.action.CREATE:
            if not isinstance(request.data, dict):
                raise KubernetesError(status=400, reason="BadRequest", message="the body is not an object")
            return await self._create(request)
        if request.name is None:
            raise KubernetesError(
                status=405, reason="MethodNotAllowed", message="a collection is not patched"
            )
        key: ObjectKey = (res, request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted:
            raise KubernetesError(
                status=404, reason="NotFound", message=f"{res.plural} {request.name!r} not found"
            )
        if request.subresource not in (None, "status"):
            raise KubernetesError(
                status=404, reason="NotFound", message=f"no subresource {request.subresource}"
            )
        if request.action == enums.action.DELETE:
            await self._delete(key)
        else:
            await self._update(key, request)
        return None

    async def _replace(self, request: rendering.Request) -> dict[str, Any]:
        """PUT: the object becomes the body, if the body names the stored resourceVersion."""
        key: ObjectKey = (request.resource, request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted or not isinstance(request.data, dict):
            raise KubernetesError(status=404, reason="NotFound", message=f"{request.name!r} not found")
        old, body = self._objects[key].raw, copy.deepcopy(request.data)
        metadata, before = body.setdefault("metadata", {}), old["metadata"]
        if metadata.get("resourceVersion") != before.get("resourceVersion"):
            raise KubernetesError(
                status=409,
                reason="Conflict",
                message="the object has been modified; please apply your changes to the latest version",
            )
        for field in ("uid", "name", "namespace", "creationTimestamp", "generation"):
            if field in before:
                metadata[field] = before[field]
        await self._store(key, body, "MODIFIED")
        return copy.deepcopy(body)

    async def _create(self, request: rendering.Request) -> ObjectKey:
        res, body = request.resource, copy.deepcopy(request.data)
        metadata = body.setdefault("metadata", {})
        if request.namespace and "namespace" not in metadata:
            metadata["namespace"] = request.namespace
        if "name" not in metadata and "generateName" in metadata:  # e.g. kopf's events
            metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:5]
            request.data.setdefault("metadata", {})["name"] = metadata["name"]  # kmock's answer finds it
        key: ObjectKey = (res, metadata.get("namespace") or request.namespace, metadata.get("name"))
        if key in self._objects and not self._objects[key].deleted:
            raise KubernetesError(
                status=409, reason="AlreadyExists", message=f"{res.plural} {key[2]!r} exists"
            )
        if self._has_status(res):
            status = body.pop("status", None)
            if res == PODS:
                body["status"] = {"phase": "Pending"}
            elif res == NODES and status is not None:
                body["status"] = status  # a kubelet registers its node with the node's status
        body = self._admit(res, body)
        metadata = body["metadata"]
        metadata.update(uid=str(uuid.uuid4()), generation=1, creationTimestamp=_now())
        for field in ("deletionTimestamp", "resourceVersion"):
            metadata.pop(field, None)
        await self._store(key, body, "ADDED")
        return key

    async def _update(self, key: ObjectKey, request: rendering.Request) -> None:
        res, old = key[0], self._objects[key].raw
        patched = self._patched(res, old, request)
        if request.subresource == "status":
            new = {**copy.deepcopy(old), "status": patched.get("status")}
            if new["status"] is None:
                del new["status"]
        else:
            new = patched
            if self._has_status(res):
                new.pop("status", None)
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
        # What only the API server sets stays as it was.
        metadata, before = new.setdefault("metadata", {}), old["metadata"]
        for field in ("uid", "name", "namespace", "creationTimestamp", "generation", "deletionTimestamp"):
            metadata.pop(field, None)
            if field in before:
                metadata[field] = before[field]
        metadata["resourceVersion"] = before.get("resourceVersion")
        new = self._admit(res, new)
        if new == old:
            return  # nothing changed: no new version, no event
        if _content(new) != _content(old):
            metadata = new["metadata"]
            metadata["generation"] = int(before.get("generation") or 0) + 1
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            await self._erase(key, new)  # the last finalizer went: the object goes
        else:
            await self._store(key, new, "MODIFIED")

    def _patched(self, res: Any, old: dict[str, Any], request: rendering.Request) -> dict[str, Any]:
        """`old` with the request's patch applied, as the content type says to apply it."""
        kind = (request.headers.get("Content-Type") or "").split(";")[0].strip()
        patch = request.data
        if kind == "application/json-patch+json" or isinstance(patch, list):
            if not isinstance(patch, list):
                raise KubernetesError(status=400, reason="BadRequest", message="a JSON patch is a list")
            try:
                patched: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(old), patch)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as error:
                raise KubernetesError(status=422, reason="Invalid", message=str(error)) from None
            return patched
        if kind == "application/strategic-merge-patch+json" and res in self.schemas:
            raise KubernetesError(
                status=415,
                reason="UnsupportedMediaType",
                message="strategic merge patch is not supported for custom resources",
            )
        if not isinstance(patch, dict):
            raise KubernetesError(status=400, reason="BadRequest", message="a merge patch is an object")
        wanted = _metadata(patch).get("resourceVersion")
        if wanted is not None and wanted != _metadata(old).get("resourceVersion"):
            raise KubernetesError(
                status=409, reason="Conflict", message="the object has been modified; apply to the latest"
            )
        return dict(_merge(copy.deepcopy(old), patch))

    def _admit(self, res: Any, body: dict[str, Any]) -> dict[str, Any]:
        """The body as the CRD's schema leaves it (pruned, defaulted), or a 422 naming what is wrong."""
        schema = self.schemas.get(res)
        if schema is None:
            return body
        admitted = schema.admit(body)
        errors = schema.errors(admitted)
        if errors:
            kind = self.resources[res].kind or res.plural
            name = _metadata(body).get("name")
            raise KubernetesError(
                status=422,
                reason="Invalid",
                message=f'{kind}.{res.group} "{name}" is invalid: {"; ".join(errors)}',
            )
        return admitted

    def _has_status(self, res: Any) -> bool:
        return res in self.resources and "status" in (self.resources[res].subresources or ())

    # --- deletion and garbage collection ----------------------------------------------------------
    async def _delete(self, key: ObjectKey) -> None:
        obj = self._objects[key].raw
        metadata = obj["metadata"]
        if metadata.get("deletionTimestamp"):
            return  # already being deleted
        if metadata.get("finalizers"):
            marked = copy.deepcopy(obj)
            marked["metadata"]["deletionTimestamp"] = _now()
            await self._store(key, marked, "MODIFIED")
            return
        await self._erase(key, obj)

    async def _erase(self, key: ObjectKey, last: dict[str, Any]) -> None:
        """The object goes; then its dependents whose owners are all gone (background propagation)."""
        last = copy.deepcopy(last)
        self._latest += 1
        last["metadata"]["resourceVersion"] = str(self._latest)
        self._objects[key] = [last, None]  # kmock's soft deletion: the last state, then none
        self._unlink(key, last)
        await self._publish(key[0], "DELETED", last)
        for dependent in sorted(self._dependents.pop(last["metadata"]["uid"], set()), key=str):
            await self._collect_if_orphaned(dependent)

    async def _collect_if_orphaned(self, key: ObjectKey) -> None:
        if key not in self._objects or self._objects[key].deleted:
            return
        owners = [ref.get("uid") for ref in _metadata(self._objects[key].raw).get("ownerReferences") or []]
        if owners and not any(uid in self._by_uid for uid in owners):
            await self._delete(key)

    def _link(self, key: ObjectKey, obj: Mapping[str, Any]) -> None:
        metadata = _metadata(obj)
        self._by_uid[metadata["uid"]] = key
        for ref in metadata.get("ownerReferences") or []:
            self._dependents[ref.get("uid")].add(key)

    def _unlink(self, key: ObjectKey, obj: Mapping[str, Any]) -> None:
        metadata = _metadata(obj)
        self._by_uid.pop(metadata["uid"], None)
        for ref in metadata.get("ownerReferences") or []:
            dependents = self._dependents.get(ref.get("uid"))
            if dependents is not None:
                dependents.discard(key)
                if not dependents:
                    del self._dependents[ref.get("uid")]

    # --- storage and watch events ---------------------------------------------------------------
    async def _store(self, key: ObjectKey, body: dict[str, Any], event: str) -> None:
        """Keep `body` as the object's state under the next resourceVersion, and tell the watchers."""
        self._latest += 1
        body["metadata"]["resourceVersion"] = str(self._latest)
        if key in self._objects and not self._objects[key].deleted:
            self._unlink(key, self._objects[key].raw)
        self._objects[key] = body  # only the newest state is kept: 25,000 pods patched many times
        self._link(key, body)
        await self._publish(key[0], event, body)

    async def _publish(self, res: Any, kind: str, obj: dict[str, Any]) -> None:
        event = {"type": kind, "object": obj}
        history = self._history[res]
        history.append((self._latest, event))
        while len(history) > self.history_size:
            self._compacted[res] = history.popleft()[0]
        await self._buses[res].put(event)

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[Any]:
        """The resource's changes after the request's resourceVersion (replayed from the history, or
        410 Gone when it is older), then live ones, until the watch ends. Without a resourceVersion:
        every object as ADDED first, as Kubernetes starts such a watch."""
        yield b""  # the headers go out at once, as a real API server's do
        res = request.resource
        held = self._held.get(res)
        if held is not None:
            await held.wait()  # cut off (watch_gap): the request waits for the connection to return
        since = request.params.get("resourceVersion", "")
        number = next(self._watch_numbers)
        async with self._lock:
            bus = self._buses[res]
            mark = await bus.mark()
            if since.isdigit() and int(since) > 0:
                if int(since) < self._compacted[res]:
                    backlog = [self._gone(int(since), res)]
                else:
                    backlog = [event for version, event in self._history[res] if version > int(since)]
            else:
                backlog = [{"type": "ADDED", "object": obj} for obj in self._current(res, request.namespace)]
        timer = self._end_later(request, number)
        try:
            for event in backlog:
                if event["type"] == "ERROR":
                    yield event
                    return
                if self._watched(request, event):
                    yield event
            async with contextlib.aclosing(bus.stream(since=mark)) as events:
                async for item in events:
                    if isinstance(item, _WatchEnd):
                        if item.watch is None or item.watch == number:
                            if item.bookmark:
                                yield self._bookmark(res)
                            return
                    elif self._watched(request, item):
                        yield item
        finally:
            if timer is not None:
                timer.cancel()
            with contextlib.suppress(ValueError):  # already unmarked by a closing bus
                await bus.unmark(mark)

    def _end_later(self, request: rendering.Request, number: int) -> asyncio.TimerHandle | None:
        """End this watch after `watch_seconds` or the client's `timeoutSeconds`, whichever is first."""
        asked = request.params.get("timeoutSeconds", "")
        limits = [s for s in (self.watch_seconds, float(asked) if asked.isdigit() else None) if s]
        if not limits:
            return None
        bus = self._buses[request.resource]

        def end() -> None:
            task = asyncio.ensure_future(bus.put(_WatchEnd(number, bookmark=True)))
            self._timers.add(task)
            task.add_done_callback(self._timers.discard)

        return asyncio.get_running_loop().call_later(min(limits), end)

    def _watched(self, request: rendering.Request, event: Mapping[str, Any]) -> bool:
        metadata = _metadata(event.get("object") or {})
        if request.namespace is not None and metadata.get("namespace") != request.namespace:
            return False
        selector = request.params.get("labelSelector")
        return not selector or matches(metadata.get("labels") or {}, selector)

    def _gone(self, since: int, res: Any) -> dict[str, Any]:
        message = f"too old resource version: {since} ({self._compacted[res]})"
        status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
        return {"type": "ERROR", "object": {**status, "message": message, "reason": "Expired", "code": 410}}

    def _bookmark(self, res: Any) -> dict[str, Any]:
        kind = self.resources[res].kind if res in self.resources else None
        version = f"{res.group}/{res.version}" if res.group else res.version
        return {
            "type": "BOOKMARK",
            "object": {
                "kind": kind,
                "apiVersion": version,
                "metadata": {"resourceVersion": str(self._latest)},
            },
        }

    async def expire_watches(self, plural: str) -> None:
        """End every watch of `plural` now, each with a bookmark (as the API server's timeout does)."""
        await self._buses[resource(plural)].put(_WatchEnd(None, bookmark=True))

    @contextlib.asynccontextmanager
    async def watch_gap(self, plural: str) -> AsyncIterator[None]:
        """The watches of `plural` are cut off until the block ends (a network partition between the
        watchers and the API server): they drop without a bookmark, and a new watch waits. When the
        block ends, the history is compacted to now: a watcher comes back with a resourceVersion from
        before the gap, gets 410 Gone, and must list again to learn what changed meanwhile."""
        res = resource(plural)
        released = self._held[res] = asyncio.Event()
        await self._buses[res].put(_WatchEnd(None, bookmark=False))
        try:
            yield
        finally:
            async with self._lock:
                self._compacted[res] = self._latest
                self._history[res].clear()
            del self._held[res]
            released.set()

    # --- reads ------------------------------------------------------------------------------------
    def _current(self, res: Any, namespace: str | None) -> Iterator[dict[str, Any]]:
        for (kind, ns, _name), obj in self._objects.items():
            if kind == res and not obj.deleted and (namespace is None or ns == namespace):
                yield obj.raw

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
        if request.resource not in self._get_resources():
            raise KubernetesError(status=404, reason="NotFound", message=f"no resource {request.resource}")
        async with self._lock:  # the items and the version they are a snapshot of, together
            items = list(self._current(request.resource, request.namespace))
            listed: dict[str, Any] = {"metadata": {"resourceVersion": str(self._latest)}, "items": items}
        selector = request.params.get("labelSelector")
        if selector:
            listed["items"] = [
                item for item in items if matches(_metadata(item).get("labels") or {}, selector)
            ]
        limit = request.params.get("limit", "")
        token = request.params.get("continue")
        if token or (limit.isdigit() and int(limit) > 0):
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
        """The objects of `plural` now (copies: a test may change them freely)."""
        return [copy.deepcopy(obj) for obj in self._current(resource(plural), namespace)]


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (`null` removes a key; lists are replaced)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge(merged.get(key), value)
    return merged
