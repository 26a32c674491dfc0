"""The reading side of the emulated API server (tests/support/cluster_emulator.py): watches, lists
and the lookup of one object, mixed into `ClusterEmulator` in front of kmock's own.

- watches: a watch from a `resourceVersion` replays the changes after it from the resource's history
  (the last `history_size` events); a version older than the history gets the watch event
  `ERROR 410 Gone` ("too old resource version"), upon which a client must list again. A watch ends
  after `watch_seconds` (or the client's `timeoutSeconds`) with a BOOKMARK of the newest version, as
  the API server's watch timeout ends it; `expire_watches` ends a resource's watches now, and
  `watch_gap` cuts them off for a while and compacts the history, so the watchers come back to 410;
- lists: label selectors (`key=value`, `key!=value`, `key`, `!key`, comma-joined), pages (`limit`
  and `continue`, each list a snapshot, as Kubernetes serves them), the list's `resourceVersion`
  taken with its items;
- the one object a fetch, patch or delete names is one dict lookup, not kmock's walk of every
  object (a 25,000-pod job, benchmarks/operator_scale.py, made that walk quadratic).

Not emulated: field selectors.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import itertools
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from kmock import KubernetesError, resource
from kmock._internal import k8s_dicts, rendering

from tests.support.kube_objects import matches, metadata_of

HISTORY_SIZE = 1000
"""Watch events kept per resource, to replay to a watch that resumes from a resourceVersion."""


def _line(event: Mapping[str, Any]) -> bytes:
    """A watch event as its line of the stream, encoded here by orjson (kmock would encode a dict
    with the standard library's encoder: a tenth of the emulator's time while an operator watched
    25,000 pods being created, py-spy on benchmarks/operator_scale.py)."""
    return orjson.dumps(event) + b"\n"


@dataclass(frozen=True)
class _WatchEnd:
    """A bus item that ends watches of its resource: one (`watch`, its number) or all (None)."""

    watch: int | None
    bookmark: bool


class WatchesAndLists:
    """Watches, lists and reads of `ClusterEmulator`: placed before kmock's KubernetesEmulator in its
    bases, so that these replace kmock's `_serve_watch`, `_serve_list` and object lookup. They read the
    emulator's objects, lock, buses and newest version (`_latest`); its writes hand every change to
    `_publish`."""

    _latest: int

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()  # type: ignore[misc]
        self.watch_seconds: float | None = None
        """A watch ends after this long (None: only when the client or `expire_watches` ends it)."""
        self.history_size = HISTORY_SIZE
        self._history: dict[Any, collections.deque[tuple[int, dict[str, Any]]]] = collections.defaultdict(
            collections.deque
        )
        self._compacted: dict[Any, int] = collections.defaultdict(int)
        """Per resource: the newest version the history no longer holds (older watches get 410)."""
        self._held: dict[Any, asyncio.Event] = {}
        self._watch_numbers = itertools.count()
        self._timers: set[asyncio.Task[None]] = set()
        self._unlisted: dict[str, list[Any]] = {}  # continue token -> the rest of a paged list
        self._unlisted_versions: dict[str, str] = {}  # continue token -> its snapshot's resourceVersion

    # --- watch events ---------------------------------------------------------------------------
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
                    yield _line(event)
                    return
                if self._watched(request, event):
                    yield _line(event)
            async with contextlib.aclosing(bus.stream(since=mark)) as events:
                async for item in events:
                    if isinstance(item, _WatchEnd):
                        if item.watch is None or item.watch == number:
                            if item.bookmark:
                                yield _line(self._bookmark(res))
                            return
                    elif self._watched(request, item):
                        yield _line(item)
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
        metadata = metadata_of(event.get("object") or {})
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

    async def _serve_list(self, request: rendering.Request) -> rendering.Response:
        """A list, or a page of one, encoded by orjson: kmock's JSON encoding of a page (the standard
        library's) and its lookup of the known resources (a walk of every stored object), for each
        of 50 pages, were nine tenths of the emulator's time in a 25,000-pod listing (py-spy on
        benchmarks/operator_scale.py: the listing took 6.6 s of a restarted operator's 8)."""
        listed = await self._listed(request)
        return rendering.Response(payload=orjson.dumps(listed), headers={"Content-Type": "application/json"})

    async def _listed(self, request: rendering.Request) -> dict[str, Any]:
        limit = request.params.get("limit", "")
        token = request.params.get("continue")
        if token:  # the rest of a snapshot taken at the first page (not the whole store walked again)
            listed: dict[str, Any] = {"metadata": {"resourceVersion": self._unlisted_versions.get(token, "")}}
            self._page(listed, int(limit) if limit.isdigit() else 0, token)
            return listed
        if request.resource not in self._get_resources():
            raise KubernetesError(status=404, reason="NotFound", message=f"no resource {request.resource}")
        async with self._lock:  # the items and the version they are a snapshot of, together
            items = list(self._current(request.resource, request.namespace))
            listed = {"metadata": {"resourceVersion": str(self._latest)}, "items": items}
        selector = request.params.get("labelSelector")
        if selector:
            listed["items"] = [
                item for item in items if matches(metadata_of(item).get("labels") or {}, selector)
            ]
        if limit.isdigit() and int(limit) > 0:
            self._page(listed, int(limit) if limit.isdigit() else 0, token)
        return listed

    def _page(self, listed: dict[str, Any], limit: int, token: str | None) -> None:
        """Cut `listed` to one page: the first of a snapshot of its items, or the next of the snapshot
        `token` names (410 Gone when there is none); `metadata.continue` names the rest, if any."""
        if token:
            if token not in self._unlisted:
                raise KubernetesError(status=410, reason="Expired", message=f"no list continues at {token}")
            items = self._unlisted.pop(token)
            self._unlisted_versions.pop(token, None)
        else:
            items = listed["items"]
        limit = limit if limit > 0 else len(items)
        listed["items"], rest = items[:limit], items[limit:]
        if rest:
            following = uuid.uuid4().hex
            self._unlisted[following] = rest
            self._unlisted_versions[following] = listed["metadata"]["resourceVersion"]
            listed["metadata"]["continue"] = following
            listed["metadata"]["remainingItemCount"] = len(rest)

    # --- for the harness and the assertions ----------------------------------------------------
    def live(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """The objects of `plural` now (copies: a test may change them freely)."""
        return [copy.deepcopy(obj) for obj in self._current(resource(plural), namespace)]
