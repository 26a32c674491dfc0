"""The supervisor's one door to the API server: annotations on its own pod, and nothing else.

In a cluster the supervisors coordinate with each other directly; the API server hears from them only
through their own pods (the Role `slicekeeper-supervisor` in charts/slicekeeper/templates/rbac.yaml):

- `slicekeeper.dev/replace: <reason>`: a supervisor the leader retired while alive (a straggler, a
  crash-looping host) asks the operator for a new pod with its identity on other capacity;
- `slicekeeper.dev/status: <json>`: the leader's view of the job (step, active slices, restarts by
  kind, last checkpoint step, goodput), which the operator copies into the TrainingJob's status.

The pod is named by `POD_NAME` / `POD_NAMESPACE` (the downward API). The client is configured from the
pod's service account, or from `KUBECONFIG` outside a cluster (the test harness), and keeps the rules
of slicekeeper/api_rules.py (the Lease's client is the same: `pod_api_client`). A write that fails is
reported to the caller, never raised: training does not stop because the API server is unreachable.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from slicekeeper import leader_view, protocol
from slicekeeper.api_rules import SUPERVISOR_BURST, SUPERVISOR_QPS, TokenBucket, limited_client
from slicekeeper.leader_view import LeaderView


class OwnPod:
    def __init__(self, namespace: str, name: str, uid: str | None = None) -> None:
        self.namespace = namespace
        self.name = name
        self.uid = uid
        """This pod's uid, sent with every patch: a pod of the same name made since (this one's
        replacement) is another uid, and the API server refuses the patch (409)."""
        self._api: Any = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OwnPod | None:
        """The pod this process runs in, or None outside one (no POD_NAME)."""
        name, namespace = env.get(protocol.ENV_POD_NAME), env.get(protocol.ENV_POD_NAMESPACE)
        return cls(namespace, name, env.get(protocol.ENV_POD_UID) or None) if name and namespace else None

    def _core(self) -> Any:
        if self._api is None:
            from kubernetes import client  # the `operator` extra: only pods need it

            self._api = client.CoreV1Api(pod_api_client())
        return self._api

    def annotate(self, annotations: dict[str, str]) -> str | None:
        """Merge `annotations` into this pod's; returns why it failed, or None. Blocking: call it in
        a thread from asyncio code."""
        try:
            metadata: dict[str, Any] = {"annotations": annotations}
            if self.uid:
                metadata["uid"] = self.uid
            self._core().patch_namespaced_pod(self.name, self.namespace, {"metadata": metadata})
        except Exception as error:  # any failure (import, config, HTTP) is reported, not raised
            return f"could not annotate pod {self.namespace}/{self.name}: {_said(error)}"[:500]
        return None

    def ask_replacement(self, reason: str) -> str | None:
        return self.annotate({protocol.ANNOTATION_REPLACE: reason or "retired by the leader"})

    def publish_status(self, status: LeaderView) -> str | None:
        return self.annotate({protocol.ANNOTATION_STATUS: leader_view.encode(status)})


def _said(error: Exception) -> str:
    """What went wrong: an HTTP answer's status and message (e.g. 409 and the API server's
    "Precondition failed: UID in precondition" for a pod replaced since), else the error."""
    status = getattr(error, "status", None)
    if status is None:
        return repr(error)
    try:
        message = json.loads(getattr(error, "body", None) or "{}").get("message")
    except ValueError:
        message = None
    return f"{status} {getattr(error, 'reason', '')}: {message or getattr(error, 'body', '')}"


def pod_api_client() -> Any:
    """The supervisor's client of the API server, one per process: configured from the pod's service
    account (or KUBECONFIG, as the fake kubelet's pods have it), keeping slicekeeper's rules (rate
    limit, retries with backoff, Retry-After: slicekeeper/api_rules.py)."""
    global _client
    if _client is None:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        limiter = TokenBucket(SUPERVISOR_QPS, SUPERVISOR_BURST)
        # Fewer and shorter retries than the operator's: a leader's renewal must land within its
        # deadline or give up (the lease's duration fences it either way).
        _client = limited_client(client.Configuration.get_default_copy(), limiter, total=3, backoff_max=2.0)
    return _client


_client: Any = None
