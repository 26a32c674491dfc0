"""The operator's own watch of the jobs' pods: one paged listing, then a watch from its version, as
client-go's informers keep a cache (and as kopf's watch did before it).

Why not kopf's pod watch: a restarted operator then listed every job pod twice (kopf's listing, and
the store's own listing of each job it resumed, which the resume handler cannot wait for kopf's
to finish) and handed each of the 25,000 pods of a large job through kopf's per-object machinery,
all on one interpreter: serving again took about 30 s (benchmarks/operator_scale.py). And kopf says
nothing of where a listing begins or ends, so the store had to guess a re-list after a watch gap
from a pod described twice, and check pods against the API server one at a time for the rest.

Here the listing's boundaries are known (`Sink.listing_began`, `listing_ended`): a pod the listing
lacks is gone, whatever the gap hid. The loop, in a thread of its own:

- list the pods `selector` picks, `LIST_PAGE_SIZE` at a time (operator/cluster.py), handing each one
  to the sink as it comes;
- watch from the listing's resourceVersion, with bookmarks, until the server ends the watch
  (`WATCH_SECONDS`, or sooner); then watch again from the newest version seen;
- a watch answered 410 Gone (the version is no longer in the server's history), as an event or as
  the request's own status, lists again;
- any other failure (a refused connection, a 500 the retries did not get past) is logged, and the
  same step is tried again after a backoff (`BACKOFF_SECONDS`, doubling up to `BACKOFF_MAX_SECONDS`).

The API rules of every other request hold (slicekeeper/api_rules.py): each page and each watch takes
a token of the operator's rate limit, and 429 and 5xx answers are retried with backoff.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import kubernetes

logger = logging.getLogger(__name__)

WATCH_SECONDS = 300
"""How long each watch asks the server to keep it open (the server may end it sooner)."""
BACKOFF_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 10.0
GONE = 410


class Sink(Protocol):
    """Where an informer delivers what it learns, in order, from its own thread."""

    def listing_began(self) -> None:
        """A listing begins: what it brings is the whole state once it ends."""

    def listed(self, obj: dict[str, Any]) -> None:
        """One object of the listing."""

    def listing_ended(self) -> None:
        """The listing is complete: what it did not bring is gone."""

    def changed(self, event_type: str, obj: dict[str, Any]) -> None:
        """A watch event after the listing: ADDED, MODIFIED or DELETED."""


Pages = Callable[[], Iterator[tuple[list[dict[str, Any]], str]]]
"""A listing, a page at a time: (the page's objects, the listing's resourceVersion)."""


class WatchStream(Protocol):
    """A watch under way: its events (type and object) as they come; `shutdown` ends it from
    another thread."""

    def __iter__(self) -> Iterator[dict[str, Any]]: ...

    def shutdown(self) -> None: ...


Watch = Callable[[str, int], WatchStream]
"""A watch from a resourceVersion for at most so many seconds."""


class Gone(Exception):
    """The watch's resourceVersion is older than the server's history: list again."""


class Informer:
    """Keeps `sink` told of the objects a listing and watch (`pages`, `watch`) show, until `stop`."""

    def __init__(self, name: str, pages: Pages, watch: Watch, sink: Sink) -> None:
        self.name = name
        self._pages = pages
        self._watch = watch
        self._sink = sink
        self._stopping = threading.Event()
        self._stream: WatchStream | None = None
        self._stream_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"informer-{name}", daemon=True)
        self.listings = 0
        """Listings completed (the first, then one after each watch that came back to 410)."""

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop now: the watch under way is shut down, and nothing more reaches the sink once this
        returns (a daemon thread: the process does not wait for it beyond `timeout`)."""
        self._stopping.set()
        with self._stream_lock:
            if self._stream is not None:
                try:
                    self._stream.shutdown()
                except Exception:  # (its reader then wakes at the watch's own end: the join waits)
                    logger.exception("the %s watch could not be shut down", self.name)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        version: str | None = None
        backoff = BACKOFF_SECONDS
        while not self._stopping.is_set():
            try:
                version = self._list() if version is None else self._follow(version)
                backoff = BACKOFF_SECONDS
            except Gone as gone:
                logger.info("the %s watch is too old (%s): listing them again", self.name, gone)
                version = None
            except Exception as error:  # the API server unreachable or failing: try again, later
                if self._stopping.is_set():
                    break  # (its own shutdown of the watch)
                logger.warning("the %s watch failed (%s); again in %.1f s", self.name, error, backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_SECONDS)

    def _list(self) -> str:
        """List everything, tell the sink; the listing's resourceVersion."""
        started = time.monotonic()
        self._sink.listing_began()
        version, count = "", 0
        for items, version in self._pages():
            for obj in items:
                if self._stopping.is_set():
                    return version
                self._sink.listed(obj)
            count += len(items)
        if self._stopping.is_set():
            return version
        self._sink.listing_ended()
        self.listings += 1
        logger.info("listed %d %s in %.1f s", count, self.name, time.monotonic() - started)
        return version

    def _follow(self, version: str) -> str:
        """Watch from `version` until the server ends the watch; the newest version seen."""
        try:
            stream = self._watch(version, WATCH_SECONDS)
        except kubernetes.client.ApiException as error:  # (the request itself answered 410, not an event)
            if error.status == GONE:
                raise Gone(str(error.reason)) from None
            raise
        with self._stream_lock:
            self._stream = stream
        if self._stopping.is_set():  # (stopped while the watch was being opened)
            stream.shutdown()
        try:
            return self._events(stream, version)
        finally:
            with self._stream_lock:
                self._stream = None

    def _events(self, stream: WatchStream, version: str) -> str:
        for event in stream:
            if self._stopping.is_set():
                break
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == GONE:
                    raise Gone(obj.get("message") or "410 Gone")
                raise kubernetes.client.ApiException(status=obj.get("code"), reason=obj.get("message"))
            version = (obj.get("metadata") or {}).get("resourceVersion") or version
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._sink.changed(str(kind), obj)
        return version
