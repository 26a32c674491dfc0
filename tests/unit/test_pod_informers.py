"""What a pod's event asks of the operator, tried again when it fails (operator/pod_informers.py): an
action whose requests failed is decided again after a backoff, for as long as no newer event of the
pod was heard; a newer event's decision replaces it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from slicekeeper.operator import pod_informers
from slicekeeper.operator.pod_informers import PodInformers
from slicekeeper.operator.pod_store import PodStore


def pod(name: str, phase: str, version: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": f"uid-{name}",
            "labels": {"slicekeeper.dev/job": "llm"},
            "resourceVersion": version,
        },
        "status": {"phase": phase},
    }


class Watch:
    """A watch answer: `events` once `after` is set (at once if None), then nothing until shut down."""

    def __init__(self, events: list[dict[str, Any]], after: threading.Event | None = None) -> None:
        self.events, self.after, self.shut = events, after, threading.Event()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self.after is not None:
            self.after.wait(10)
        yield from self.events
        self.shut.wait(10)

    def shutdown(self) -> None:
        self.shut.set()


class Cluster:
    """The two calls an informer makes: one listing, then one watch."""

    def __init__(self, listing: list[dict[str, Any]], watch: Watch) -> None:
        self.listing, self.watch = listing, watch

    def pod_pages(self, namespace: str | None, selector: str) -> Iterator[tuple[list[dict[str, Any]], str]]:
        yield self.listing, "1"

    def watch_pods(self, namespace: str | None, selector: str, since: str, seconds: int) -> Watch:
        return self.watch


def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pod_informers, "RETRY_SECONDS", 0.05)


def test_a_failed_action_is_decided_again_and_tried_until_it_succeeds() -> None:
    tries: list[str] = []

    def hot_swap() -> None:
        tries.append("hot-swap")
        if len(tries) < 3:
            raise ConnectionError("the API server is away")

    def react(event_type: str | None, obj: dict[str, Any]) -> Callable[[], None] | None:
        return hot_swap if obj["status"]["phase"] == "Failed" else None

    informers = PodInformers(Cluster([pod("llm-s0-w0", "Failed", "5")], Watch([])), PodStore(), [None], react)  # type: ignore[arg-type]
    informers.start()
    try:
        eventually(lambda: len(tries) == 3, "three tries")
        time.sleep(0.2)  # (and no fourth)
        assert tries == ["hot-swap"] * 3 and informers.retries == 2
    finally:
        informers.stop()


def test_a_newer_event_of_the_pod_drops_the_retry_of_an_older_one() -> None:
    """The first try fails only once the newer event was heard: its retry must then be dropped."""
    trying, newer_heard = threading.Event(), threading.Event()
    tries: list[str] = []

    def hot_swap() -> None:
        tries.append("hot-swap")
        trying.set()
        newer_heard.wait(10)
        raise ConnectionError("the API server is away")

    def react(event_type: str | None, obj: dict[str, Any]) -> Callable[[], None] | None:
        if obj["status"]["phase"] == "Failed":
            return hot_swap
        newer_heard.set()
        return None

    newer = {"type": "MODIFIED", "object": pod("llm-s0-w0", "Running", "6")}  # (its replacement, say)
    cluster = Cluster([pod("llm-s0-w0", "Failed", "5")], Watch([newer], after=trying))
    informers = PodInformers(cluster, PodStore(), [None], react)  # type: ignore[arg-type]
    informers.start()
    try:
        eventually(newer_heard.is_set, "the newer event")
        time.sleep(0.3)  # six backoffs
        assert tries == ["hot-swap"] and informers.retries == 0
    finally:
        informers.stop()
