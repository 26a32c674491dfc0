"""The operator's requests (operator/cluster.py) give up on an answer that never comes: a connection
dropped without a word (a node of the API server's gone, a middlebox's state lost) fails the request,
which the retry policy then tries again, instead of holding the handler's thread, and with it a
stopping operator, for good. Against a loopback server that accepts connections and answers nothing.
Negative control (run by hand): with `request_timeout=None` the request was still waiting at the end."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3
from slicekeeper.operator import rest_client
from slicekeeper.operator.cluster import REQUEST_TIMEOUT, Cluster, client_configuration

from slicekeeper.api_rules import retry_rules


class SilentServer:
    """Accepts every connection and never answers."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.accepted: list[socket.socket] = []
        self.stopping = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:  # (closed)
                return
            self.accepted.append(connection)

    def close(self) -> None:
        self.stopping.set()
        self.listener.close()
        for connection in self.accepted:
            connection.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


def test_every_request_but_a_watch_has_a_timeout_by_default() -> None:
    assert Cluster(client_configuration(server="http://127.0.0.1:1")).request_timeout == REQUEST_TIMEOUT
    connect, read = REQUEST_TIMEOUT
    assert 0 < connect <= 30 and 0 < read <= 120


def test_a_request_never_answered_fails_and_is_retried_instead_of_holding_its_thread(
    silent: SilentServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rest_client, "retry_rules", lambda **kw: {**retry_rules(**kw), "total": 1})
    cluster = Cluster(client_configuration(server=silent.url), request_timeout=(1.0, 0.5))
    outcome: list[Any] = []

    def delete() -> None:
        try:
            outcome.append(cluster.delete_pod("research", "tiny-lm-s0-w0"))
        except Exception as error:  # what the handler (and then kopf's retry) gets
            outcome.append(error)

    thread = threading.Thread(target=delete, daemon=True)
    thread.start()
    thread.join(30)  # (a guard against a hang, not a timing: the request needs about 1.5 s)
    assert outcome, "the request still waits for an answer that will never come"
    assert isinstance(outcome[0], urllib3.exceptions.MaxRetryError), outcome
    assert isinstance(outcome[0].reason, urllib3.exceptions.ReadTimeoutError), outcome
    assert len(silent.accepted) == 2  # the request and its one retry, each on a new connection
