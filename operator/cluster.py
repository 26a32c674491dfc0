"""The operator's access to the API server: the official client, with retries and idempotent creates.

Every write the operator makes goes through here, so that the rules hold everywhere:

- a create that finds the object already there (409 Conflict) is success: handlers are retried and
  the operator may restart in the middle of a reconciliation, so creating twice must be harmless;
- 429 and 5xx answers are retried with exponential backoff by the client's own urllib3 retry policy
  (`retry_policy`); what still fails reaches kopf, which retries the handler later;
- a delete of an object already gone (404) is success too.

The job's pods are listed a page at a time (`LIST_PAGE_SIZE`) and parsed from the raw JSON: a
25,000-pod list in one piece (about 90 MB of JSON) made into the client's models took the operator's
peak memory to 1.9 GB when it deleted such a job (benchmarks/operator_scale.py); paged, 0.2 GB. The
same listing fills the operator's pod store when it first reads a job (operator/pod_store.py).

`writes` counts the write requests made, for the scale benchmark's "API writes per hot-swap".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

import kubernetes
import urllib3
from slicekeeper.operator.render import GROUP, LABEL_JOB, Manifest

VERSION = "v1alpha1"
PLURAL = "trainingjobs"

RETRIED_STATUSES = (429, 500, 502, 503, 504)
LIST_PAGE_SIZE = 500
"""Pods per list request: a page is about 2 MB of JSON, a 25,000-pod job 50 pages."""


def _done_unless(call: Callable[[], object], already: int) -> bool:
    """Make the call; False when the server answers `already` (409: it exists, 404: it is gone)."""
    try:
        call()
    except kubernetes.client.ApiException as error:
        if error.status == already:
            return False
        raise
    return True


def retry_policy() -> urllib3.Retry:
    return urllib3.Retry(
        total=6,
        backoff_factor=0.2,  # 0.2, 0.4, 0.8, ... seconds
        status_forcelist=RETRIED_STATUSES,
        allowed_methods=None,  # POST and PATCH too: every write here is idempotent
        respect_retry_after_header=True,
        raise_on_status=False,
    )


def client_configuration(server: str | None = None) -> kubernetes.client.Configuration:
    """In a pod: the service account; else the kubeconfig; `server` overrides both (tests)."""
    if server is not None:
        configuration = kubernetes.client.Configuration()
        configuration.host = server
    else:
        try:
            kubernetes.config.load_incluster_config()
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config()
        configuration = kubernetes.client.Configuration.get_default_copy()
    configuration.retries = retry_policy()
    return configuration


@dataclass
class Cluster:
    configuration: kubernetes.client.Configuration
    writes: int = 0
    _core: kubernetes.client.CoreV1Api = field(init=False)
    _custom: kubernetes.client.CustomObjectsApi = field(init=False)

    def __post_init__(self) -> None:
        client = kubernetes.client.ApiClient(self.configuration)
        self._core = kubernetes.client.CoreV1Api(client)
        self._custom = kubernetes.client.CustomObjectsApi(client)
        self._networking = kubernetes.client.NetworkingV1Api(client)

    def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge `status` into a TrainingJob's status (outside its own handlers, which use kopf's patch)."""
        self.writes += 1
        self._custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": status}
        )

    def create(self, manifest: Manifest) -> bool:
        """Create `manifest` in its namespace; False when it was already there."""
        namespace, kind = manifest["metadata"]["namespace"], manifest["kind"]
        client = kubernetes.client
        self.writes += 1
        if kind == "Pod":
            pod = client.V1Pod.model_validate(manifest)
            return _done_unless(lambda: self._core.create_namespaced_pod(namespace, pod), already=409)
        if kind == "Service":
            service = client.V1Service.model_validate(manifest)
            return _done_unless(lambda: self._core.create_namespaced_service(namespace, service), already=409)
        if kind == "ConfigMap":
            config_map = client.V1ConfigMap.model_validate(manifest)
            return _done_unless(
                lambda: self._core.create_namespaced_config_map(namespace, config_map), already=409
            )
        if kind == "Secret":  # the job's credentials: created once, never read back (no get, no list)
            secret = client.V1Secret.model_validate(manifest)
            return _done_unless(lambda: self._core.create_namespaced_secret(namespace, secret), already=409)
        if kind == "NetworkPolicy":
            policy = client.V1NetworkPolicy.model_validate(manifest)
            return _done_unless(
                lambda: self._networking.create_namespaced_network_policy(namespace, policy), already=409
            )
        raise ValueError(f"the operator creates no {kind}")

    def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete the pod now (no grace: its host is being replaced); False when it was gone."""
        self.writes += 1
        return _done_unless(
            lambda: self._core.delete_namespaced_pod(name, namespace, grace_period_seconds=0), already=404
        )

    def pod_uid(self, namespace: str, name: str) -> str | None:
        """The uid of the pod of that name, None when there is none (a read: the pod store's check)."""
        try:
            response = cast(  # unread, as `_preload_content=False` asks (the client's type says a model)
                urllib3.BaseHTTPResponse,
                self._core.read_namespaced_pod(name, namespace, _preload_content=False),
            )
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return None
            raise
        try:
            uid = (json.loads(response.data).get("metadata") or {}).get("uid")
        finally:
            response.release_conn()
        return str(uid) if uid else None

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
        """The job's pods, listed LIST_PAGE_SIZE at a time and parsed from the raw JSON (the client's
        models of them are never built)."""
        token: str | None = None
        while True:
            response = cast(  # unread, as `_preload_content=False` asks (the client's type says a model)
                urllib3.BaseHTTPResponse,
                self._core.list_namespaced_pod(
                    namespace,
                    label_selector=f"{LABEL_JOB}={job}",
                    limit=LIST_PAGE_SIZE,
                    _continue=token,
                    _preload_content=False,
                ),
            )
            try:
                page = json.loads(response.data)
            finally:
                response.release_conn()
            yield from page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or None
            if token is None:
                return

    def create_all(self, manifests: Iterable[Manifest]) -> int:
        """Create each manifest not there yet; the number created."""
        return sum(self.create(manifest) for manifest in manifests)
