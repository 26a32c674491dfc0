"""The rules toward the API server (slicekeeper/api_rules.py) as a supervisor's client keeps them.

Against a small HTTP server of this process that answers as a busy API server would: a 429 with
`Retry-After: 1`, then a 500, then the pod. The supervisor's client (supervisor/pod/own_pod.py, whose
client the job's Lease uses too) gets its annotation through, the second attempt no sooner than the
Retry-After said; a plain client of the library fails at the 429 (the negative control). Its rate
limit spaces a burst of requests out: at most `burst` at once, then `qps` a second.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest
from slicekeeper.supervisor.leader.election import Holder, cluster_election
from slicekeeper.supervisor.pod import own_pod

from slicekeeper.api_rules import TokenBucket, limited_client
from tests.support.supervisor_client import point_supervisor_client

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tiny-lm-s0-w0", "namespace": "research"}}


class BusyApiServer(http.server.ThreadingHTTPServer):
    def __init__(self, answers: list[int]) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.answers = answers
        """The status of each request in turn; 200 once they are spent."""
        self.seen: list[tuple[float, str, str]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
    server: BusyApiServer

    def answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.seen.append((time.monotonic(), self.command, self.path))
        status = self.server.answers.pop(0) if self.server.answers else 200
        body = json.dumps(POD if status == 200 else {"kind": "Status", "code": status}).encode()
        self.send_response(status)
        if status == 429:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PATCH = do_POST = do_PUT = answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def busy() -> Iterator[BusyApiServer]:
    server = BusyApiServer([429, 500])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def kubeconfig(busy: BusyApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor's client built afresh, from a kubeconfig naming the busy server."""
    point_supervisor_client(busy.url, tmp_path, monkeypatch)


def test_a_supervisors_annotation_waits_out_a_429_and_a_500(busy, kubeconfig):
    pod = own_pod.OwnPod("research", "tiny-lm-s0-w0")
    assert pod.annotate({"slicekeeper.dev/status": "{}"}) is None
    assert [method for _, method, _ in busy.seen] == ["PATCH", "PATCH", "PATCH"]
    first, second = busy.seen[0][0], busy.seen[1][0]
    assert second - first >= 1.0  # the 429's Retry-After
    # The job's Lease is read and written through the same client.
    election = cluster_election("tiny-lm-leader", "research", Holder("node-0", 0, "10.0.0.1:8476"), "tiny-lm")
    assert election.lock.api_instance.api_client is own_pod.pod_api_client()


def test_negative_control_a_plain_client_gives_up_at_the_429(busy, kubeconfig):
    kubernetes.config.load_kube_config()
    plain = kubernetes.client.CoreV1Api()
    with pytest.raises(kubernetes.client.ApiException) as refused:
        plain.patch_namespaced_pod("tiny-lm-s0-w0", "research", {"metadata": {"annotations": {}}})
    assert refused.value.status == 429


def test_the_rate_limit_lets_a_burst_through_then_qps_a_second(busy):
    busy.answers.clear()
    configuration = kubernetes.client.Configuration()
    configuration.host = busy.url
    api = kubernetes.client.CoreV1Api(limited_client(configuration, TokenBucket(qps=5, burst=2)))
    started = time.monotonic()
    for _ in range(6):
        api.read_namespaced_pod("tiny-lm-s0-w0", "research")
    # Timed where the bucket is, not by the server's arrivals: on a loaded machine the first request
    # can arrive late, making the server's spread shorter than the waits (0.789 s against 0.79, seen).
    elapsed = time.monotonic() - started
    assert len(busy.seen) == 6
    assert elapsed >= (6 - 2) / 5  # four waited for a token each, 0.2 s apart
