"""The operator's access to the API server: the official client, with retries and idempotent creates.

Every write the operator makes goes through here, so that the rules hold everywhere:

- a create that finds the object already there (409 Conflict) is success: handlers are retried and
  the operator may restart in the middle of a reconciliation, so creating twice must be harmless;
- 429 and 5xx answers are retried with exponential backoff by the client's own urllib3 retry policy
  (`retry_policy`, operator/rest_client.py; the creates of many pods keep the same rules from an
  event loop: operator/loop_creates.py); what still fails reaches kopf, which retries the handler
  later;
- a delete of an object already gone (404) is success too, and so is a patch of a pod's annotations
  that finds the pod gone (its notice went with it).

The jobs' pods are listed a page at a time (`LIST_PAGE_SIZE`) and parsed from the raw JSON with
orjson (the standard library's decoder was half the operator's CPU in a restart at 25,000 pods): a
25,000-pod list in one piece (about 90 MB of JSON) made into the client's models took the operator's
peak memory to 1.9 GB when it deleted such a job (benchmarks/operator_scale.py); paged, 0.2 GB. The
same listing fills the operator's pod store (operator/pod_informers.py).

`writes` counts the write requests made, for the scale benchmark's "API writes per hot-swap".

Every HTTP request the client makes is also counted in the operator's metrics (operator/metrics.py),
by verb and resource, with the failed ones by HTTP status: each attempt, a retried one too, so the
counts are what the API server saw (`Cluster` gives the client's HTTP layer a counting subclass and
its retry policy an observer: operator/rest_client.py; the client sends `USER_AGENT`, which the API
server's audit log shows).
What the rules above call done is no error: a 409 to a create, a 404 to a delete or to a get, or to
a patch (a pod gone before its annotation).
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

import kubernetes
import orjson
import urllib3
from kubernetes.watch.watch import iter_resp_lines
from slicekeeper.operator.creation import DEFAULT_CONCURRENCY
from slicekeeper.operator.loop_creates import Create, LoopCreates
from slicekeeper.operator.metrics import NO_ANSWER, OperatorMetrics
from slicekeeper.operator.render import GROUP, LABEL_JOB, Manifest
from slicekeeper.operator.rest_client import CountedRestClient, Encoded, request_kind, retry_policy

from slicekeeper.api_rules import DEFAULT_BURST, DEFAULT_QPS, TokenBucket

VERSION = "v1alpha1"
PLURAL = "trainingjobs"

COLLECTIONS = {
    "Pod": "/api/v1/namespaces/{namespace}/pods",
    "Service": "/api/v1/namespaces/{namespace}/services",
    "ConfigMap": "/api/v1/namespaces/{namespace}/configmaps",
    # The job's credentials: created once, never read back (no get, no list).
    "Secret": "/api/v1/namespaces/{namespace}/secrets",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies",
    # What the operator did for a job, said at once where it must not be lost (`post_event`).
    "Event": "/api/v1/namespaces/{namespace}/events",
}
"""Where the operator creates each kind it creates."""
LIST_PAGE_SIZE = 500
"""Pods per list request: a page is about 2 MB of JSON, a 25,000-pod job 50 pages."""
REQUEST_TIMEOUT = (10.0, 60.0)
"""(connect, read) seconds for every request but a watch: an answer that never comes (a connection
dropped without a word) is then a failed request, retried by the retry policy and then by kopf's
handler retries, not a handler's thread held for good (and a stopping operator with it)."""
WATCH_CONNECT_SECONDS = 10
WATCH_SLACK_SECONDS = 30
"""A watch silent this long past the end it asked for is taken as dead."""
USER_AGENT = "slicekeeper-operator"
EVENT_MESSAGE_LIMIT = 1024
"""Characters of an event's message the API server takes."""
ANSWERS = frozenset({("create", 409), ("delete", 404), ("get", 404), ("patch", 404)})
"""(verb, HTTP status) that the operator takes as an answer, not an error (see the module doc)."""


@dataclass
class PodWatch:
    """A watch request's streamed answer: its events as parsed JSON, one per line."""

    response: urllib3.BaseHTTPResponse
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _ended: bool = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        try:
            for line in iter_resp_lines(self.response):
                if line and not line.isspace():
                    yield orjson.loads(line)
        finally:
            with self._lock:
                self._ended = True
            self.response.close()
            self.response.release_conn()

    def shutdown(self) -> None:
        """End the watch from another thread: its reader wakes up at once. Once the answer has ended,
        or its connection was closed under the reader (a read error), there is nothing left to do."""
        with self._lock:
            if self._ended:
                return
            with contextlib.suppress(OSError, ValueError, RuntimeError):  # (urllib3's words for closed)
                self.response.shutdown()


def _done_unless(call: Callable[[], object], already: int) -> bool:
    """Make the call; False when the server answers `already` (409: it exists, 404: it is gone)."""
    try:
        call()
    except kubernetes.client.ApiException as error:
        if error.status == already:
            return False
        raise
    return True


def client_configuration(server: str | None = None) -> kubernetes.client.Configuration:
    """In a pod: the service account; else the kubeconfig; `server` overrides both (tests). The
    `Cluster` made with it sets its retry policy."""
    if server is not None:
        configuration = kubernetes.client.Configuration()
        configuration.host = server
    else:
        try:
            kubernetes.config.load_incluster_config()
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config()
        configuration = kubernetes.client.Configuration.get_default_copy()
    return configuration


@dataclass
class Cluster:
    """The operator's API client. Its `configuration` gets the retry policy (`retry_policy`); every
    request is counted in `metrics`, the operator's (operator/metrics.py)."""

    configuration: kubernetes.client.Configuration
    writes: int = 0
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    limiter: TokenBucket = field(default_factory=lambda: TokenBucket(DEFAULT_QPS, DEFAULT_BURST))
    """Every request takes a token first (slicekeeper/api_rules.py): --api-qps, --api-burst."""
    concurrency: int = DEFAULT_CONCURRENCY
    """Creates in flight at once (operator/creation.py): --create-concurrency."""
    request_timeout: tuple[float, float] = REQUEST_TIMEOUT
    _core: kubernetes.client.CoreV1Api = field(init=False)
    _custom: kubernetes.client.CustomObjectsApi = field(init=False)
    _writes_lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.configuration.retries = retry_policy(observe=self.record_request)
        # A connection for each create in flight, and a few for the handlers' other requests.
        pool = self.configuration.connection_pool_maxsize or 0
        self.configuration.connection_pool_maxsize = max(pool, self.concurrency + 4)
        client = kubernetes.client.ApiClient(self.configuration)
        client.rest_client = CountedRestClient(
            self.configuration,
            observe=self.record_request,
            limiter=self.limiter,
            timeout=self.request_timeout,
        )
        client.user_agent = USER_AGENT
        self._core = kubernetes.client.CoreV1Api(client)
        self._custom = kubernetes.client.CustomObjectsApi(client)
        self._networking = kubernetes.client.NetworkingV1Api(client)

    def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge `status` into a TrainingJob's status (outside its own handlers, which use kopf's patch)."""
        self._wrote()
        self._custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": status}
        )

    def _wrote(self) -> None:
        with self._writes_lock:  # creates run in threads (`create_all`)
            self.writes += 1

    def _request(self, manifest: Manifest) -> Create:
        """The create of `manifest` in its namespace, as the client would send it (a write counted).

        The manifest is posted as it is: the client's generated calls validate the body into its
        models and serialize those (0.6 ms of CPU a pod); a dictionary serializes in 0.03 ms. It is
        plain JSON already (dicts, lists, strings, numbers): the client's walk of a body
        (`sanitize_for_serialization`) would copy it unchanged (a quarter of the creating threads'
        time, py-spy --gil, 5,000 pods), and orjson encodes it in a fifth of `json.dumps`'s time
        (4 us against 45 a pod, `python -m benchmarks.render_cost`)."""
        namespace, kind = manifest["metadata"]["namespace"], manifest["kind"]
        if kind not in COLLECTIONS:
            raise ValueError(f"the operator creates no {kind}")
        self._wrote()
        _, url, headers, _, _ = self._core.api_client.param_serialize(
            method="POST",
            resource_path=COLLECTIONS[kind],
            path_params={"namespace": namespace},
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=None,
            auth_settings=["BearerToken"],
        )
        return Create(url, headers, orjson.dumps(manifest))

    def create(self, manifest: Manifest) -> bool:
        """Create `manifest` in its namespace; False when it was already there (409). The answer is
        not decoded (the client's models of the created object): only its status is wanted."""
        request = self._request(manifest)
        response = self._core.api_client.call_api("POST", request.url, request.headers, Encoded(request.body))
        response.read()
        if response.status == 409:
            return False
        if not 200 <= response.status <= 299:
            raise kubernetes.client.ApiException.from_response(
                http_resp=response, body=response.data.decode(errors="replace"), data=None
            )
        return True

    def post_event(self, about: Mapping[str, Any], *, warning: bool, reason: str, message: str) -> None:
        """A Kubernetes event on the object `about` (a TrainingJob's body), posted now, before the
        caller's next write: kopf's `kopf.event` queues it for a task of its own, and an operator
        killed meanwhile lost it while the writes it told of had landed."""
        metadata = about["metadata"]
        now = datetime.datetime.now(datetime.UTC).isoformat()
        # Named as client-go's recorder names its events (the object's name and the time in
        # nanoseconds), not by `generateName`: `create` takes a 409 for "already there", which for a
        # generated name that happened to be taken would have dropped the event without a word.
        self.create(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {
                    "namespace": metadata["namespace"],
                    "name": f"{metadata['name']}.{time.time_ns():x}",
                },
                "type": "Warning" if warning else "Normal",
                "reason": reason,
                "message": message[:EVENT_MESSAGE_LIMIT],
                "source": {"component": USER_AGENT},
                "reportingComponent": USER_AGENT,
                "involvedObject": {
                    "apiVersion": about["apiVersion"],
                    "kind": about["kind"],
                    "name": metadata["name"],
                    "namespace": metadata["namespace"],
                    "uid": metadata.get("uid"),
                },
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            }
        )

    def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete the pod now (no grace: its host is being replaced); False when it was gone. The
        answer (the pod as deleted) is not decoded into the client's models: that was 0.2 ms of CPU
        for each of a job's pods deleted (py-spy, benchmarks/operator_scale.py at 5,000 hosts)."""
        self._wrote()

        def delete() -> None:
            response = cast(  # unread, as `_preload_content=False` asks (the client's type says a model)
                urllib3.BaseHTTPResponse,
                self._core.delete_namespaced_pod(
                    name, namespace, grace_period_seconds=0, _preload_content=False
                ),
            )
            response.drain_conn()
            response.release_conn()

        return _done_unless(delete, already=404)

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str | None]) -> bool:
        """Merge `annotations` into the pod's (None removes one); False when the pod was gone."""
        self._wrote()
        patch = {"metadata": {"annotations": annotations}}
        return _done_unless(
            lambda: self._core.patch_namespaced_pod(
                name, namespace, patch, _content_type="application/merge-patch+json"
            ),
            already=404,
        )

    def delete_children(self, namespace: str, job: str) -> int:
        """Delete every pod, Service, ConfigMap and NetworkPolicy labelled as the job's: the
        finalizer's cleanup."""
        selector = f"{LABEL_JOB}={job}"
        # Every name first, then the deletes: no page changes while the pods are listed.
        names = [pod["metadata"]["name"] for pod in self.job_pods(namespace, job)]
        deleted = sum(self.delete_pod(namespace, name) for name in names)
        serialize = self._core.api_client.sanitize_for_serialization
        services = serialize(self._core.list_namespaced_service(namespace, label_selector=selector).items)
        maps = serialize(self._core.list_namespaced_config_map(namespace, label_selector=selector).items)
        policies = serialize(
            self._networking.list_namespaced_network_policy(namespace, label_selector=selector).items
        )
        for items, delete in (
            (services, self._core.delete_namespaced_service),
            (maps, self._core.delete_namespaced_config_map),
            (policies, self._networking.delete_namespaced_network_policy),
        ):
            for item in items:
                self.writes += 1
                deleted += _done_unless(partial(delete, item["metadata"]["name"], namespace), already=404)
        return deleted

    def job_pods(self, namespace: str, job: str) -> Iterator[dict[str, Any]]:
        """The job's pods (the finalizer's cleanup lists them to delete them)."""
        for items, _version in self.pod_pages(namespace, f"{LABEL_JOB}={job}"):
            yield from items

    def pod_pages(self, namespace: str | None, selector: str) -> Iterator[tuple[list[dict[str, Any]], str]]:
        """The pods `selector` picks in `namespace` (None: every namespace), LIST_PAGE_SIZE at a time
        and parsed from the raw JSON (the client's models of them are never built): (a page's pods,
        the listing's resourceVersion)."""
        token: str | None = None
        while True:
            response = cast(  # unread, as `_preload_content=False` asks (the client's type says a model)
                urllib3.BaseHTTPResponse,
                self._pod_collection(namespace)(
                    label_selector=selector, limit=LIST_PAGE_SIZE, _continue=token, _preload_content=False
                ),
            )
            try:
                page = orjson.loads(response.data)  # (json: 3.8 s of a 25,000-pod listing's 8 s of CPU)
            finally:
                response.release_conn()
            metadata = page.get("metadata") or {}
            yield page.get("items") or [], str(metadata.get("resourceVersion") or "")
            token = metadata.get("continue") or None
            if token is None:
                return

    def watch_pods(self, namespace: str | None, selector: str, since: str, seconds: int) -> PodWatch:
        """A watch of the pods `selector` picks, from resourceVersion `since`, with bookmarks, for at
        most `seconds` (operator/informer.py)."""
        response = cast(
            urllib3.BaseHTTPResponse,
            self._pod_collection(namespace)(
                label_selector=selector,
                watch=True,
                resource_version=since,
                allow_watch_bookmarks=True,
                timeout_seconds=seconds,
                _preload_content=False,
                # A connection silent past the watch's own end is dead: the informer watches again.
                _request_timeout=(WATCH_CONNECT_SECONDS, seconds + WATCH_SLACK_SECONDS),
            ),
        )
        return PodWatch(response)

    def _pod_collection(self, namespace: str | None) -> Callable[..., object]:
        if namespace is None:
            return self._core.list_pod_for_all_namespaces
        return partial(self._core.list_namespaced_pod, namespace)

    def create_all(self, manifests: Iterable[Manifest]) -> int:
        """Create each manifest not there yet, `concurrency` at a time in slow-start batches
        (operator/creation.py), from an event loop (operator/loop_creates.py); the number created."""
        creates = LoopCreates(self.configuration, self.limiter, self.record_request, self.request_timeout)
        return creates.create_all(map(self._request, manifests), concurrency=self.concurrency)

    def record_request(self, method: str, url: str, status: int | None) -> None:
        """One HTTP request made, and how it was answered: into the operator's metrics."""
        verb, resource = request_kind(method, url)
        self.metrics.api_requests.labels(verb=verb, resource=resource).inc()
        if status is None or (status >= 400 and (verb, status) not in ANSWERS):
            code = NO_ANSWER if status is None else str(status)
            self.metrics.api_errors.labels(verb=verb, resource=resource, code=code).inc()
