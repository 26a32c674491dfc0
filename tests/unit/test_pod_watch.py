"""A pod watch's streamed answer (operator/cluster.py `PodWatch`), over a real HTTP connection on
loopback: its events parsed line by line, and `shutdown` from another thread at any moment, before
the answer ended (its reader wakes at once) or after (nothing to do). The operator's cleanup stops
the pod informers with it; a shutdown that raised there had kopf retry the cleanup a minute later,
and the stopped operator lingered that long."""

from __future__ import annotations

import contextlib
import http.server
import os
import threading
from collections.abc import Iterator

import pytest
import urllib3
from slicekeeper.operator.cluster import PodWatch

EVENTS = [b'{"type": "ADDED", "object": {"metadata": {"name": "p0"}}}', b'{"type": "BOOKMARK", "object": {}}']


class Answer(http.server.BaseHTTPRequestHandler):
    """The events, a line each; then the answer ends, or (path /hold) the connection stays open."""

    def do_GET(self) -> None:
        with contextlib.suppress(ConnectionError):  # (the client shut its end down)
            self._answer()

    def _answer(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for line in [*EVENTS, b" "]:
            body = line + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(body), body))
        self.wfile.flush()
        if self.path == "/hold":
            self.server.release.wait(10)  # type: ignore[attr-defined]
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    httpd.release = threading.Event()  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.release.set()  # type: ignore[attr-defined]
    httpd.shutdown()
    httpd.server_close()


def watch(url: str) -> PodWatch:
    response = urllib3.PoolManager().request("GET", url, preload_content=False, timeout=10)
    return PodWatch(response)


def test_the_events_are_parsed_a_line_each_and_blank_lines_skipped(server: str) -> None:
    events = list(watch(f"{server}/"))
    assert [event["type"] for event in events] == ["ADDED", "BOOKMARK"]
    assert events[0]["object"]["metadata"]["name"] == "p0"


def test_a_shutdown_wakes_the_reader_of_an_answer_still_open(server: str) -> None:
    stream = watch(f"{server}/hold")
    seen: list[str] = []
    ended = threading.Event()

    def read() -> None:
        try:
            for event in stream:
                seen.append(event["type"])
        except Exception:  # (the connection shut under it: how the informer's reader wakes)
            pass
        ended.set()

    threading.Thread(target=read, daemon=True).start()
    while len(seen) < 2:
        ended.wait(0.01)
    assert not ended.is_set()
    stream.shutdown()
    assert ended.wait(5), "the reader still waits on a shut-down watch"


def test_a_shutdown_after_the_answer_ended_does_nothing(server: str) -> None:
    stream = watch(f"{server}/")
    assert len(list(stream)) == 2
    stream.shutdown()  # (the informer stopping just as its watch ended)
    stream.shutdown()


def test_a_shutdown_before_the_answer_was_read_ends_it(server: str) -> None:
    stream = watch(f"{server}/hold")
    stream.shutdown()
    with pytest.raises(Exception):  # noqa: B017 (whatever the reader of a shut connection raises)
        for _ in stream:
            pass
    stream.shutdown()


def test_a_shutdown_of_a_watch_whose_connection_was_closed_under_its_reader_does_nothing(server: str) -> None:
    stream = watch(f"{server}/hold")
    sock = stream.response._sock_shutdown.__self__  # type: ignore[attr-defined]  # (the watch's socket)
    os.close(sock.detach())  # (as urllib3 closes it on a read error, before the iteration ended)
    stream.shutdown()
