"""The creates of many objects, sent from one event loop over aiohttp, with the client's rules.

`Cluster.create_all` makes a job's pods `concurrency` at a time (operator/creation.py). Sent by that
many threads through the official client, every step of every request (sending, the answer's
arrival, its parsing) waited for the interpreter's lock anew, behind the operator's other threads:
with 64 creates in flight and the API server answering in 50 ms, a create took 92 ms, and 25,000
pods 36 s (benchmarks/operator_scale.py, docs/benchmarks.md). Here one thread runs an event loop
with every create in flight on it, and the answers that arrive together are read in one turn.

The rules of every other request hold (slicekeeper/api_rules.py): each attempt takes a token of the
operator's rate limit first; 429 and 5xx answers and failed connections are retried as the client's
urllib3 retry policy says, with urllib3's own reckoning of the waits (backoff with jitter, or the
answer's Retry-After); every attempt is told to the operator's metrics. The requests are those the
official client would send: its configuration's address, TLS settings and proxy, and the headers
its `param_serialize` makes (the bearer token refreshed by the configuration's hook, the user agent).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
import kubernetes
import urllib3
from slicekeeper.operator.creation import create_in_batches
from slicekeeper.operator.rest_client import Observer

from slicekeeper.api_rules import TokenBucket, retry_rules


@dataclass(frozen=True)
class Create:
    """One create request, ready to send: its URL, headers and JSON body."""

    url: str
    headers: dict[str, str]
    body: bytes


class CreateFailed(kubernetes.client.ApiException):  # type: ignore[misc]
    """An answer that is neither a creation nor a 409 (the client's exception, as the threads raised)."""


def ssl_context(configuration: kubernetes.client.Configuration) -> ssl.SSLContext | None:
    """The TLS settings the official client takes from `configuration` (None: plain HTTP)."""
    if not str(configuration.host).startswith("https"):
        return None
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif configuration.assert_hostname is False:
        context.check_hostname = False
    return context


@dataclass
class LoopCreates:
    """Sends creates from an event loop of its own (`create_all` runs one in the calling thread)."""

    configuration: kubernetes.client.Configuration
    limiter: TokenBucket
    observe: Observer
    timeout: tuple[float, float]

    def create_all(self, creates: Iterable[Create], *, concurrency: int) -> int:
        """Send each create, `concurrency` in flight; the number created (409: there already). Called
        from a thread without an event loop (kopf's handlers run in its executor's threads)."""
        return asyncio.run(self._create_all(creates, concurrency))

    async def _create_all(self, creates: Iterable[Create], concurrency: int) -> int:
        connector = aiohttp.TCPConnector(limit=concurrency, ssl=ssl_context(self.configuration) or False)
        timeout = aiohttp.ClientTimeout(sock_connect=self.timeout[0], sock_read=self.timeout[1])
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

            async def create(request: Create) -> bool:
                return await self._send(session, request)

            return await create_in_batches(creates, create, concurrency=concurrency)

    async def _send(self, session: aiohttp.ClientSession, request: Create) -> bool:
        """One create, retried as the rules say; True when created, False when it was there (409)."""
        retry = urllib3.Retry(**retry_rules())
        extra: dict[str, Any] = {}
        if self.configuration.proxy:
            extra["proxy"] = self.configuration.proxy
        if self.configuration.tls_server_name:
            extra["server_hostname"] = self.configuration.tls_server_name
        while True:
            await asyncio.sleep(self.limiter.reserve())
            try:
                async with session.post(
                    request.url, data=request.body, headers=request.headers, **extra
                ) as answer:
                    status, reason, headers = answer.status, answer.reason, dict(answer.headers)
                    body = await answer.read()  # (read, not decoded: a connection left unread is closed)
            except (aiohttp.ClientError, TimeoutError) as error:
                self.observe("POST", request.url, None)
                try:
                    retry = retry.increment("POST", request.url, error=_as_urllib3(error))
                except urllib3.exceptions.MaxRetryError:
                    raise error from None
                await asyncio.sleep(retry.get_backoff_time())
                continue
            stub = urllib3.HTTPResponse(body=b"", headers=headers, status=status, preload_content=False)
            if retry.is_retry("POST", status, has_retry_after="Retry-After" in headers):
                try:
                    retry = retry.increment("POST", request.url, response=stub)
                except urllib3.exceptions.MaxRetryError:
                    pass  # spent: this answer is the create's (as `raise_on_status=False` gives it)
                else:
                    self.observe("POST", request.url, status)
                    after = retry.get_retry_after(stub) if retry.respect_retry_after_header else None
                    await asyncio.sleep(after if after is not None else retry.get_backoff_time())
                    continue
            self.observe("POST", request.url, status)
            if status == 409:
                return False
            if not 200 <= status <= 299:
                failed = CreateFailed(status=status, reason=reason)
                failed.body = body.decode(errors="replace")
                raise failed
            return True


def _as_urllib3(error: BaseException) -> Exception:
    """urllib3's name for a failed connection or read, which its retry policy counts."""
    if isinstance(error, TimeoutError | aiohttp.ServerTimeoutError):
        return urllib3.exceptions.ReadTimeoutError(None, "", str(error))  # type: ignore[arg-type]
    return urllib3.exceptions.ProtocolError(str(error))
