"""A supervisor's watch on its own pod: each new notice the operator writes is passed on once, a
malformed one is said and skipped, and a watch that fails is opened again.

The pod's changes are played by a fake of the watch's stream (the real one, against the emulated API
server, runs in tests/operator/test_announced_losses.py)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import pytest
from slicekeeper.supervisor.pod import pod_notices
from slicekeeper.supervisor.pod.own_pod import OwnPod
from slicekeeper.supervisor.pod.pod_notices import PodNotice, parse_notice, watch_notices

MAINTENANCE = json.dumps({"kind": "maintenance", "at": 1_900_000_000.0, "source": "node label"})
PREEMPTION = json.dumps({"kind": "preemption", "at": 1_900_000_100.0})


def test_a_notice_is_read_from_its_annotation():
    notice = parse_notice(MAINTENANCE)
    assert (notice.kind, notice.at, notice.source) == ("maintenance", 1_900_000_000.0, "node label")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("soon", "not a notice"),
        (json.dumps({"kind": "meteor", "at": 1.0}), "kind"),
        (json.dumps({"kind": "maintenance"}), "at"),
    ],
)
def test_a_malformed_notice_names_the_annotation(text, problem):
    with pytest.raises(ValueError, match=rf"annotation slicekeeper.dev/notice: .*{problem}"):
        parse_notice(text)


def scripted(*rounds: list[str | None] | Exception):
    """A fake stream: each round is one watch (its values, or the error it fails with)."""
    played = iter(rounds)

    def values(pod: OwnPod, stop: threading.Event) -> Iterator[str | None]:
        try:
            script = next(played)
        except StopIteration:
            stop.wait()  # a watch with nothing more to say
            return
        if isinstance(script, Exception):
            raise script
        yield from script

    return values


def watched(monkeypatch: pytest.MonkeyPatch, *rounds: list[str | None] | Exception) -> tuple[list, list]:
    monkeypatch.setattr(pod_notices, "_annotation_values", scripted(*rounds))
    monkeypatch.setattr(pod_notices, "RETRY_SECONDS", 0.01)
    heard: list[PodNotice] = []
    said: list[str] = []

    async def scenario() -> None:
        async def on_notice(notice: PodNotice) -> None:
            heard.append(notice)

        watch = asyncio.ensure_future(watch_notices(OwnPod("ns", "pod-1"), on_notice, said.append))
        await asyncio.sleep(0.3)
        watch.cancel()

    asyncio.run(scenario())
    return heard, said


def test_each_new_notice_is_passed_on_once(monkeypatch):
    heard, said = watched(monkeypatch, [None, MAINTENANCE, MAINTENANCE, None, MAINTENANCE, PREEMPTION])
    assert [n.kind for n in heard] == ["maintenance", "preemption"] and said == []


def test_a_malformed_notice_is_said_and_the_next_one_still_heard(monkeypatch):
    heard, said = watched(monkeypatch, ["soon", PREEMPTION])
    assert [n.kind for n in heard] == ["preemption"]
    assert said and "not a notice" in said[0]


def test_a_failed_watch_is_opened_again(monkeypatch):
    heard, said = watched(monkeypatch, ConnectionError("refused"), [MAINTENANCE])
    assert [n.kind for n in heard] == ["maintenance"]
    assert "watching pod ns/pod-1 failed: ConnectionError('refused')" in said[0]


def test_negative_control_a_watch_that_keeps_failing_passes_nothing_on(monkeypatch):
    heard, said = watched(monkeypatch, *[ConnectionError("refused")] * 5)
    assert heard == [] and len(said) == 5
