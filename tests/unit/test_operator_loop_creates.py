"""The operator's creates from its event loop (operator/loop_creates.py) reach the API server as the
official client's requests would: over TLS with the configuration's CA, client certificate and
server name, with its bearer token (refreshed by its hook) and user agent; 429s waited out and
counted; a create that finds its object there is no error; and a server whose certificate the
configuration does not trust, or that wants a client certificate the configuration lacks, gets
nothing.

The API server is a small aiohttp server speaking mutual TLS 1.3 with a job's credentials
(slicekeeper/credentials.py): its certificate names `*.tiny-lm.research`, so the creates must ask
for `api.tiny-lm.research` though they connect to 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp.web
import kubernetes
import orjson
import pytest
from slicekeeper.operator import loop_creates
from slicekeeper.operator.cluster import USER_AGENT, Cluster

from slicekeeper import credentials
from slicekeeper.api_rules import retry_rules

pytestmark = pytest.mark.asyncio


class ApiServer:
    """Answers pod creates: the first one 429 (Retry-After: 0), a name it has 409, else 201."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.names: set[str] = {"there-already"}
        self.throttled = False
        self.connections: set[Any] = set()
        """The client ends of the connections that created something."""

    async def create(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        body = orjson.loads(await request.read())
        self.seen.append({"headers": dict(request.headers), "name": body["metadata"]["name"]})
        if not self.throttled:
            self.throttled = True
            return aiohttp.web.Response(status=429, headers={"Retry-After": "0"})
        if body["metadata"]["name"] in self.names:
            return aiohttp.web.Response(status=409, text="AlreadyExists")
        self.names.add(body["metadata"]["name"])
        self.connections.add(request.transport.get_extra_info("peername") if request.transport else None)
        body["status"] = {"padding": "x" * 300_000}  # an answer that arrives in many reads
        return aiohttp.web.json_response(body, status=201)


@contextlib.asynccontextmanager
async def serving(server: ApiServer, own: Path) -> AsyncIterator[int]:
    app = aiohttp.web.Application()
    app.router.add_post("/api/v1/namespaces/{namespace}/pods", server.create)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0, ssl_context=credentials.server_context(own))
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


@pytest.fixture(scope="module")
def job_credentials() -> credentials.JobCredentials:
    return credentials.generate("tiny-lm.research")


def configuration(port: int, own: Path, **overrides: Any) -> kubernetes.client.Configuration:
    config = kubernetes.client.Configuration()
    config.host = f"https://127.0.0.1:{port}"
    config.ssl_ca_cert = str(own / credentials.CA_FILE)
    config.cert_file = str(own / credentials.CERT_FILE)
    config.key_file = str(own / credentials.KEY_FILE)
    config.tls_server_name = "api.tiny-lm.research"
    config.api_key = {"authorization": "expired"}
    config.api_key_prefix = {"authorization": "Bearer"}
    config.refresh_api_key_hook = lambda c: c.api_key.update(authorization="fresh")
    for name, value in overrides.items():
        setattr(config, name, value)
    return config


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "research"}}


async def test_creates_go_over_the_configurations_tls_with_its_fresh_token_and_keep_the_rules(
    tmp_path: Path, job_credentials: credentials.JobCredentials
):
    own = job_credentials.write(tmp_path / "own")
    server = ApiServer()
    async with serving(server, own) as port:
        cluster = Cluster(configuration(port, own))
        names = ["there-already", "a", "b", "c"]
        created = await asyncio.to_thread(cluster.create_all, [pod(name) for name in names])
    assert created == 3  # one was there (409)
    assert sorted(server.names) == ["a", "b", "c", "there-already"]
    assert len(server.seen) == 5  # the first create twice: refused (429), then sent again
    assert {s["headers"]["Authorization"] for s in server.seen} == {"Bearer fresh"}
    assert {s["headers"]["User-Agent"] for s in server.seen} == {USER_AGENT}
    requests = cluster.metrics.api_requests.labels(verb="create", resource="pods")._value.get()
    refused = cluster.metrics.api_errors.labels(verb="create", resource="pods", code="429")._value.get()
    assert (requests, refused) == (5, 1)
    assert cluster.writes == 4


@pytest.mark.parametrize(
    "wrong",
    ["no client certificate", "another CA", "another server name"],
)
async def test_negative_control_without_the_configurations_tls_nothing_is_created(
    tmp_path: Path, job_credentials: credentials.JobCredentials, wrong: str, monkeypatch
):
    monkeypatch.setattr(loop_creates, "retry_rules", lambda: retry_rules(total=1))  # fail fast
    own = job_credentials.write(tmp_path / "own")
    overrides: dict[str, Any] = {
        "no client certificate": {"cert_file": None, "key_file": None},
        "another CA": {
            "ssl_ca_cert": str(credentials.generate("other").write(tmp_path / "o") / credentials.CA_FILE)
        },
        "another server name": {"tls_server_name": "api.other.research"},
    }[wrong]
    server = ApiServer()
    async with serving(server, own) as port:
        cluster = Cluster(configuration(port, own, **overrides))
        with pytest.raises(aiohttp.ClientError):
            await asyncio.to_thread(cluster.create_all, [pod("a")])
    assert server.seen == []
    errors = cluster.metrics.api_errors.labels(verb="create", resource="pods", code="none")._value.get()
    assert errors == 2  # the attempt and its retry, both without an answer


async def test_the_creates_keep_their_connections_open(
    tmp_path: Path, job_credentials: credentials.JobCredentials
):
    """Every answer is read to its end, so a connection serves the next create: 200 creates, 64 at a
    time, over at most 64 TLS connections (unread, each answer's connection was closed: about 200)."""
    own = job_credentials.write(tmp_path / "own")
    server = ApiServer()
    async with serving(server, own) as port:
        cluster = Cluster(configuration(port, own))
        created = await asyncio.to_thread(cluster.create_all, [pod(f"p{n}") for n in range(200)])
    assert created == 200
    assert len(server.connections) <= cluster.concurrency, len(server.connections)
