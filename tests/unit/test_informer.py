"""The operator's informer (operator/informer.py): a listing, then watches from the newest version
seen; a 410 lists again, any other failure watches again after a backoff; stopping ends the watch
under way and nothing more reaches the sink."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest
from slicekeeper.operator import informer as informer_module
from slicekeeper.operator.informer import Informer


def obj(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}}


class Recorder:
    """A sink that writes down what it is told."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str]] = []
        self.changed_event = threading.Event()

    def listing_began(self) -> None:
        self.told.append(("began", ""))

    def listed(self, item: dict[str, Any]) -> None:
        self.told.append(("listed", item["metadata"]["name"]))

    def listing_ended(self) -> None:
        self.told.append(("ended", ""))

    def changed(self, event_type: str, item: dict[str, Any]) -> None:
        self.told.append((event_type, item["metadata"]["name"]))
        self.changed_event.set()


class Stream:
    """A watch's answer: its events, then (`hold`) nothing until shut down."""

    def __init__(self, events: list[dict[str, Any]], hold: bool = False) -> None:
        self.events, self.hold = events, hold
        self.shut = threading.Event()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        yield from self.events
        if self.hold:
            self.shut.wait(10)
            raise ConnectionResetError("shut down")

    def shutdown(self) -> None:
        self.shut.set()


class Server:
    """Listings (a list of pages each) and watch answers, served in turn; the watches' versions."""

    def __init__(self, listings: list[list[list[dict[str, Any]]]], streams: list[Stream | Exception]) -> None:
        self.listings, self.streams = listings, streams
        self.watched_from: list[str] = []
        self.lists = 0

    def pages(self) -> Iterator[tuple[list[dict[str, Any]], str]]:
        pages = self.listings.pop(0)
        self.lists += 1
        for page in pages:
            yield page, f"list-{self.lists}"

    def watch(self, version: str, seconds: int) -> Stream:
        self.watched_from.append(version)
        answer = self.streams.pop(0) if self.streams else Stream([], hold=True)
        if isinstance(answer, Exception):
            raise answer
        return answer


def run(server: Server, until: Callable[[Recorder], bool]) -> tuple[Informer, Recorder]:
    sink = Recorder()
    informer = Informer("things", server.pages, server.watch, sink)
    informer.start()
    deadline = time.monotonic() + 10
    while not until(sink):
        assert time.monotonic() < deadline, sink.told
        time.sleep(0.01)
    return informer, sink


def test_lists_then_watches_from_the_listing_s_version_and_then_from_the_newest_seen() -> None:
    server = Server(
        [[[obj("a", "1")], [obj("b", "2")]]],
        [
            Stream([{"type": "MODIFIED", "object": obj("a", "5")}]),  # then the server ends it
            Stream([{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}]),
            Stream([{"type": "DELETED", "object": obj("b", "10")}], hold=True),
        ],
    )
    informer, sink = run(server, lambda sink: ("DELETED", "b") in sink.told)
    informer.stop()
    assert sink.told == [
        ("began", ""),
        ("listed", "a"),
        ("listed", "b"),
        ("ended", ""),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
    ]
    assert server.watched_from[:3] == ["list-1", "5", "9"]
    assert informer.listings == 1


def test_a_watch_too_old_lists_again() -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}
    server = Server([[[obj("a", "1")]], [[obj("b", "7")]]], [Stream([gone])])
    informer, sink = run(server, lambda sink: sink.told.count(("ended", "")) == 2)
    informer.stop()
    assert sink.told == [
        ("began", ""),
        ("listed", "a"),
        ("ended", ""),
        ("began", ""),
        ("listed", "b"),
        ("ended", ""),
    ]
    assert informer.listings == 2 and server.watched_from[:2] == ["list-1", "list-2"]


def test_a_watch_request_answered_410_lists_again_too() -> None:
    gone = kubernetes.client.ApiException(status=410, reason="Expired")
    server = Server([[[obj("a", "1")]], [[obj("b", "7")]]], [gone])
    informer, _ = run(server, lambda sink: sink.told.count(("ended", "")) == 2)
    informer.stop()
    assert server.lists == 2 and server.watched_from[:2] == ["list-1", "list-2"]


def test_a_failed_watch_is_tried_again_from_the_same_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(informer_module, "BACKOFF_SECONDS", 0.01)
    server = Server(
        [[[obj("a", "1")]]],
        [ConnectionRefusedError("API server away"), Stream([{"type": "ADDED", "object": obj("c", "3")}])],
    )
    informer, _ = run(server, lambda sink: ("ADDED", "c") in sink.told)
    informer.stop()
    assert server.watched_from[:2] == ["list-1", "list-1"] and server.lists == 1


def test_stopping_ends_the_watch_under_way_and_tells_the_sink_nothing_more() -> None:
    held = Stream([], hold=True)
    server = Server([[[obj("a", "1")]]], [held])
    informer, sink = run(server, lambda sink: bool(server.watched_from))
    informer.stop()
    assert held.shut.is_set()
    told = list(sink.told)
    time.sleep(0.05)
    assert sink.told == told == [("began", ""), ("listed", "a"), ("ended", "")]


class Unshuttable(Stream):
    """A watch whose shutdown fails (its connection in a state urllib3 refuses to shut down)."""

    def shutdown(self) -> None:
        super().shutdown()  # (the reader still wakes: the test ends promptly)
        raise OSError(9, "Bad file descriptor")


def test_a_failed_shutdown_of_the_watch_is_logged_and_the_stop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    held = Unshuttable([], hold=True)
    server = Server([[[obj("a", "1")]]], [held])
    informer, sink = run(server, lambda sink: bool(server.watched_from))
    informer.stop()  # (a stop that raised had kopf retry the operator's cleanup a minute later)
    assert "the things watch could not be shut down" in caplog.text
    told = list(sink.told)
    time.sleep(0.05)
    assert sink.told == told == [("began", ""), ("listed", "a"), ("ended", "")]
