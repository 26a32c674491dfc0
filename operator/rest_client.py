"""The official client's HTTP layer as the operator uses it: every request limited, timed out,
retried by the rules and counted.

`Cluster` (operator/cluster.py) gives the client's `ApiClient` a `CountedRestClient`: each request
takes a token of the operator's rate limit first (slicekeeper/api_rules.py), gets the operator's
timeout unless it sets its own (a watch), and is told to the operator's metrics with its answer's
status (or that none came); the client's retry policy (`retry_policy`, urllib3's with the rules of
`retry_rules`) tells them of each attempt it retries. A body encoded already (`Encoded`: a manifest
orjson made) is sent as it is, through the same pool, retries and timeout.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import kubernetes
import urllib3
from kubernetes.client.rest import RESTClientObject, RESTResponse
from urllib3.connectionpool import ConnectionPool

from slicekeeper.api_rules import TokenBucket, retry_rules

Observer = Callable[[str, str, int | None], None]
"""Told of each HTTP request: its method, URL, and the answer's status (None: no answer came)."""


def request_kind(method: str, url: str) -> tuple[str, str]:
    """The Kubernetes verb and resource of an API request, named as the API server's own metrics name
    them: GET of one object `get`, of a collection `list` (`watch` with `?watch=true`), POST `create`,
    PUT `update`, PATCH `patch`, DELETE `delete` (`deletecollection` of a collection); the resource is
    its plural, with its subresource if any (`pods`, `trainingjobs/status`)."""
    parts = urllib.parse.urlsplit(url)
    segments = [segment for segment in parts.path.split("/") if segment]
    rest = segments[2:] if segments[:1] == ["api"] else segments[3:] if segments[:1] == ["apis"] else []
    if len(rest) >= 3 and rest[0] == "namespaces":  # a namespaced path; `namespaces/N` alone is one
        rest = rest[2:]
    resource = "/".join(rest[:1] + rest[2:3]) or "unknown"
    named, method = len(rest) >= 2, method.upper()
    if method == "GET":
        watch = urllib.parse.parse_qs(parts.query).get("watch", [""])[0] in ("true", "1")
        return ("watch" if watch else "get" if named else "list"), resource
    if method == "DELETE":
        return ("delete" if named else "deletecollection"), resource
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower()), resource


class ObservedRetry(urllib3.Retry):
    """urllib3's retry policy, telling `observe` of each attempt it retries (its answer will not be the
    call's: the call's last answer is counted where the call returns, `_CountedRestClient`)."""

    observe: Observer | None = None

    def new(self, **kw: Any) -> Self:
        retry = super().new(**kw)
        retry.observe = self.observe
        return retry

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: urllib3.BaseHTTPResponse | None = None,
        error: Exception | None = None,
        _pool: ConnectionPool | None = None,
        _stacktrace: TracebackType | None = None,
    ) -> Self:
        retry = super().increment(method, url, response, error, _pool, _stacktrace)  # raises when spent
        if self.observe is not None:
            self.observe(method or "", url or "", response.status if response is not None else None)
        return retry


@dataclass(frozen=True)
class Encoded:
    """A request body encoded as JSON already: `CountedRestClient` sends its bytes as they are."""

    data: bytes


class CountedRestClient(RESTClientObject):
    """The client's HTTP layer, telling `observe` of each call's answer (or that none came)."""

    def __init__(
        self,
        configuration: kubernetes.client.Configuration,
        observe: Observer,
        limiter: TokenBucket,
        timeout: tuple[float, float],
    ) -> None:
        super().__init__(configuration)
        self._observe = observe
        self._limiter = limiter
        self._timeout = timeout

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> RESTResponse:
        if kwargs.get("_request_timeout") is None:  # (a watch sets its own)
            kwargs["_request_timeout"] = self._timeout
        self._limiter.take()
        try:
            if isinstance(kwargs.get("body"), Encoded):
                response = self._send_encoded(method, url, kwargs["body"], kwargs)
            else:
                response = super().request(method, url, *args, **kwargs)
        except Exception:  # no answer: refused, cut, timed out, or retries spent on those
            self._observe(method, url, None)
            raise
        self._observe(method, url, int(response.status))
        return response

    def _send_encoded(self, method: str, url: str, body: Encoded, kwargs: dict[str, Any]) -> RESTResponse:
        """A body encoded already, sent as it is (the client's `request` would encode it again with
        `json.dumps`), through the same pool, retries and timeout."""
        limit = kwargs["_request_timeout"]
        timeout = (
            urllib3.Timeout(connect=limit[0], read=limit[1])
            if isinstance(limit, tuple)
            else urllib3.Timeout(total=limit)
        )
        answer = self.pool_manager.request(
            method,
            url,
            body=body.data,
            headers=kwargs.get("headers") or {},
            timeout=timeout,
            preload_content=False,
        )
        return RESTResponse(answer)


def retry_policy(observe: Observer | None = None) -> urllib3.Retry:
    retry = ObservedRetry(**retry_rules())  # (slicekeeper/api_rules.py)
    retry.observe = observe
    return retry
