"""Helpers of the opt-in end-to-end tests (tests/e2e/): a real cluster, the official client.

The tests install the chart themselves (`chart_installed`: the Helm engine, helm-python-sdk, the
same `helm install` a user runs, with the e2e image and without the Prometheus Operator's kinds when
the cluster lacks them) and uninstall it at the end, unless an operator is already installed: then
they use it as found and leave it.

Each test gets its own namespace (with the supervisors' service account and Role as the chart
renders them, which the pods run as), waits on the TrainingJob's status, pods and
events by polling, and says on timeout what it saw last. Nodes it cordons are uncordoned when the
test ends, whatever happened. The jobs they create are checked offline, without a cluster, by
tests/unit/test_e2e_setup.py.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import helm_python
import kubernetes
import pytest
import urllib3
import yaml

from tests.support import chart
from tests.support.cli_runs import EXAMPLE

GROUP, VERSION, PLURAL = "slicekeeper.dev", "v1alpha1", "trainingjobs"
JOB = "tiny-lm"
OPERATOR_NAMESPACE = "slicekeeper-system"
OPERATOR_DEPLOYMENT = "slicekeeper-operator"
IMAGE = os.environ.get("SLICEKEEPER_E2E_IMAGE", "ghcr.io/slicekeeper/slicekeeper:latest")
JAX_PLATFORMS = os.environ.get("SLICEKEEPER_E2E_JAX_PLATFORMS", "cpu")
"""`cpu` on kind (JAX on CPU devices, gloo between pods); empty on real TPU nodes."""
RELEASE = "slicekeeper"
INSTALL = (
    "see docs/kind.md, or install it by hand: "
    "helm install slicekeeper charts/slicekeeper --namespace slicekeeper-system --create-namespace"
)
INSTALL_TIMEOUT = 600
"""Seconds for the install to be ready (the operator's image pulled or loaded, its pod available)."""
MONITORING_GROUP = "monitoring.coreos.com"
T = TypeVar("T")


@dataclass
class Api:
    core: Any
    apps: Any
    rbac: Any
    custom: Any
    extensions: Any

    def plain(self, obj: Any) -> Any:
        """A client model as the API's JSON (camelCase dicts)."""
        return self.core.api_client.sanitize_for_serialization(obj)


def connect() -> Api:
    try:
        kubernetes.config.load_kube_config()  # KUBECONFIG
    except (kubernetes.config.ConfigException, OSError) as error:
        pytest.fail(f"cannot use KUBECONFIG={os.environ.get('KUBECONFIG')}: {error}")
    client = kubernetes.client.ApiClient()
    return Api(
        core=kubernetes.client.CoreV1Api(client),
        apps=kubernetes.client.AppsV1Api(client),
        rbac=kubernetes.client.RbacAuthorizationV1Api(client),
        custom=kubernetes.client.CustomObjectsApi(client),
        extensions=kubernetes.client.ApiextensionsV1Api(client),
    )


def image_values(image: str) -> dict[str, str]:
    """The chart's `image` values for an image reference `repository[:tag]` (a registry's port is no
    tag; no tag is `latest`, as for the training pods, not the chart's default, its appVersion)."""
    repository, _, tag = image.rpartition(":")
    if not repository or "/" in tag:
        repository, tag = image, "latest"
    return {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"}


def install_values(image: str, monitoring: bool) -> dict[str, Any]:
    """The values the e2e tests install the chart with: the operator runs `image`, sized for a laptop
    (docs/kind.md); the tests make their own namespaces and their supervisors' accounts; the
    Prometheus Operator's kinds only where the cluster has them."""
    return {
        "image": image_values(image),
        "operator": {
            "resources": {
                "requests": {"cpu": "100m", "memory": "512Mi"},
                "limits": {"cpu": "1", "memory": "1Gi"},
            }
        },
        "supervisors": {"namespaces": []},
        "monitoring": {part: {"enabled": monitoring} for part in ("supervisors", "operator", "rules")},
    }


def has_prometheus_operator(api: Api) -> bool:
    groups = kubernetes.client.ApisApi(api.core.api_client).get_api_versions().groups
    return any(group.name == MONITORING_GROUP for group in groups)


def _operator_deployed(api: Api) -> bool:
    try:
        api.apps.read_namespaced_deployment(OPERATOR_DEPLOYMENT, OPERATOR_NAMESPACE)
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return False
        raise
    except urllib3.exceptions.HTTPError as error:
        pytest.fail(f"the cluster of KUBECONFIG={os.environ.get('KUBECONFIG')} does not answer: {error}")
    return True


@contextlib.contextmanager
def chart_installed(api: Api) -> Iterator[str]:
    """charts/slicekeeper installed as release `slicekeeper` in `slicekeeper-system` for the block,
    then uninstalled (its CRD stays, as Helm leaves CRDs); an operator already there is used as found.
    Yields how: "installed" or "found"."""
    if _operator_deployed(api):
        yield "found"
        return
    values = install_values(IMAGE, monitoring=has_prometheus_operator(api))
    config = helm_python.Config(namespace=OPERATOR_NAMESPACE)  # KUBECONFIG
    try:
        try:
            config.install(
                chart.CHART,
                RELEASE,
                values,
                namespace=OPERATOR_NAMESPACE,
                create_namespace=True,
                wait="watcher",
                timeout=INSTALL_TIMEOUT,
            )
        except helm_python.HelmError as error:
            with contextlib.suppress(helm_python.HelmError):
                config.uninstall(RELEASE, ignore_not_found=True, wait="watcher", timeout=300)
            pytest.fail(f"helm install of charts/slicekeeper with {values} failed: {error}")
        try:
            yield "installed"
        finally:
            try:
                config.uninstall(RELEASE, ignore_not_found=True, wait="watcher", timeout=300)
            except helm_python.HelmError as error:  # the tests' own outcome stands
                warnings.warn(f"helm uninstall {RELEASE} failed: {error}", stacklevel=2)
    finally:
        config.close()


def require_operator(api: Api) -> None:
    """Fail (not skip: the user asked for e2e) unless the CRD and a running operator are installed."""
    try:
        api.extensions.read_custom_resource_definition(f"{PLURAL}.{GROUP}")
    except kubernetes.client.ApiException as error:
        pytest.fail(f"the TrainingJob CRD is not installed ({error.status}); {INSTALL}")
    except urllib3.exceptions.HTTPError as error:
        pytest.fail(f"the cluster of KUBECONFIG={os.environ.get('KUBECONFIG')} does not answer: {error}")
    try:
        deployment = api.plain(api.apps.read_namespaced_deployment(OPERATOR_DEPLOYMENT, OPERATOR_NAMESPACE))
    except kubernetes.client.ApiException as error:
        pytest.fail(f"no Deployment {OPERATOR_NAMESPACE}/{OPERATOR_DEPLOYMENT} ({error.status}); {INSTALL}")
    if not (deployment.get("status") or {}).get("availableReplicas"):
        pytest.fail(
            f"the operator Deployment {OPERATOR_NAMESPACE}/{OPERATOR_DEPLOYMENT} has no available replica: "
            f"kubectl -n {OPERATOR_NAMESPACE} describe deployment {OPERATOR_DEPLOYMENT} (image loaded? RBAC?)"
        )


def training_job(namespace: str, *, steps: int, replacement_timeout: float | None = None) -> dict[str, Any]:
    """examples/trainingjob.yaml in `namespace` for the e2e image and `steps` (its persistent tier is a
    directory inside each pod: lost with the pod, which these tests allow)."""
    document: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    document["metadata"]["namespace"] = namespace
    workload = document["spec"]["workload"]
    workload["image"] = IMAGE
    workload["steps"] = steps
    if JAX_PLATFORMS:
        workload["env"] = [
            {"name": "JAX_PLATFORMS", "value": JAX_PLATFORMS},
            {"name": "XLA_FLAGS", "value": "--xla_force_host_platform_device_count=2"},
        ]
    if replacement_timeout is not None:
        document["spec"]["health"]["replacementTimeoutSeconds"] = replacement_timeout
    return document


def _supervisor_rbac(namespace: str) -> list[dict[str, Any]]:
    """The supervisors' ServiceAccount, Role and RoleBinding for `namespace`, as the chart renders
    them for a namespace that runs TrainingJobs (`supervisors.namespaces`)."""
    rbac = chart.rendered({"supervisors": {"namespaces": [namespace]}})["slicekeeper/templates/rbac.yaml"]
    return [d for d in rbac if d["metadata"].get("namespace") == namespace]


@contextlib.contextmanager
def job_namespace(api: Api, scenario: str) -> Iterator[str]:
    """A fresh namespace for one test; its TrainingJobs (operator finalizer first), then it, deleted."""
    name = f"sk-e2e-{scenario}-{uuid.uuid4().hex[:6]}"
    api.core.create_namespace({"metadata": {"name": name, "labels": {f"{GROUP}/e2e": scenario}}})
    try:
        for document in _supervisor_rbac(name):
            if document["kind"] == "ServiceAccount":
                api.core.create_namespaced_service_account(name, document)
            elif document["kind"] == "Role":
                api.rbac.create_namespaced_role(name, document)
            else:
                api.rbac.create_namespaced_role_binding(name, document)
        yield name
    finally:
        _delete_namespace(api, name)


def _delete_namespace(api: Api, name: str, timeout: float = 180.0) -> None:
    jobs = api.custom.list_namespaced_custom_object(GROUP, VERSION, name, PLURAL)["items"]
    for job in jobs:
        with contextlib.suppress(kubernetes.client.ApiException):
            api.custom.delete_namespaced_custom_object(GROUP, VERSION, name, PLURAL, job["metadata"]["name"])
    deadline = time.monotonic() + timeout
    while jobs and time.monotonic() < deadline:
        time.sleep(2.0)
        jobs = api.custom.list_namespaced_custom_object(GROUP, VERSION, name, PLURAL)["items"]
    if jobs:
        warnings.warn(
            f"TrainingJobs in {name} still there {timeout:.0f} s after delete: is the operator running "
            f"(its finalizer deletes them)? The namespace will stay Terminating until they go.",
            stacklevel=2,
        )
    api.core.delete_namespace(name)


@dataclass
class Cordons:
    """Nodes a test cordons (`cordon`), uncordoned by `release` (the fixture calls it at the end)."""

    api: Api
    nodes: list[str] = field(default_factory=list)

    def cordon(self, node: str) -> None:
        """Mark `node` unschedulable, unless it already was (then it is left as found)."""
        if not (self.api.plain(self.api.core.read_node(node)).get("spec") or {}).get("unschedulable"):
            self.api.core.patch_node(node, {"spec": {"unschedulable": True}})
            self.nodes.append(node)

    def release(self) -> None:
        while self.nodes:
            self.api.core.patch_node(self.nodes[-1], {"spec": {"unschedulable": False}})
            self.nodes.pop()


@contextlib.contextmanager
def cordoning(api: Api) -> Iterator[Cordons]:
    cordons = Cordons(api)
    try:
        yield cordons
    finally:
        cordons.release()


def create_job(api: Api, document: dict[str, Any]) -> None:
    namespace = document["metadata"]["namespace"]
    api.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, document)


def get_job(api: Api, namespace: str, name: str = JOB) -> dict[str, Any]:
    job: dict[str, Any] = api.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return job


def patch_spec(api: Api, namespace: str, spec: dict[str, Any], name: str = JOB) -> None:
    """A merge patch of the job's spec (what `kubectl patch --type=merge` sends)."""
    api.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": spec})


def pods(api: Api, namespace: str, job: str = JOB) -> list[dict[str, Any]]:
    listed = api.core.list_namespaced_pod(namespace, label_selector=f"{GROUP}/job={job}")
    return sorted(api.plain(listed)["items"], key=lambda p: p["metadata"]["name"])


def events(api: Api, namespace: str, job: str = JOB) -> list[dict[str, Any]]:
    """Events on the TrainingJob, oldest first."""
    listed = api.plain(api.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={job}"))
    mine = [e for e in listed["items"] if e.get("involvedObject", {}).get("kind") == "TrainingJob"]
    return sorted(mine, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")


def reasons(api: Api, namespace: str, job: str = JOB) -> list[str]:
    return [e.get("reason", "") for e in events(api, namespace, job)]


def describe(api: Api, namespace: str, job: str = JOB) -> str:
    """What a timed-out wait saw last: the job's status, its pods, the namespace's latest events."""
    lines = []
    try:
        status = get_job(api, namespace, job).get("status") or {}
        shown = {k: v for k, v in status.items() if k != "kopf"}
        lines.append(f"TrainingJob {namespace}/{job} status: {shown}")
    except kubernetes.client.ApiException as error:
        lines.append(f"TrainingJob {namespace}/{job}: {error.status} {error.reason}")
    for pod in pods(api, namespace, job):
        status = pod.get("status") or {}
        waiting = [
            (c.get("state") or {}).get("waiting", {}).get("reason")
            for c in status.get("containerStatuses") or []
            if (c.get("state") or {}).get("waiting")
        ]
        lines.append(
            f"  pod {pod['metadata']['name']} uid {pod['metadata']['uid'][:8]}: {status.get('phase')} "
            f"on {pod['spec'].get('nodeName') or '-'}" + (f" waiting {waiting}" if waiting else "")
        )
    listed = api.plain(api.core.list_namespaced_event(namespace))["items"]
    listed.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    for event in listed[-12:]:
        subject = event.get("involvedObject", {})
        lines.append(
            f"  event {subject.get('kind')}/{subject.get('name')} {event.get('type')} "
            f"{event.get('reason')}: {event.get('message')}"
        )
    return "\n".join(lines)


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout: float,
    state: Callable[[], str] | None = None,
    interval: float = 3.0,
) -> T:
    """Poll `probe` until it returns something other than None (or False); fail naming `what` and
    the last `state` after `timeout` seconds. A probe may raise AssertionError to fail at once."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found is not None and found is not False:
            return found
        if time.monotonic() > deadline:
            seen = f"\nlast seen:\n{state()}" if state is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{seen}")
        time.sleep(interval)
