"""What a TrainingJob becomes in a cluster: one pure function for the operator and `slicekeeper render`.

Children of a job named J (REFERENCES sec. 1 for the TPU conventions):

- a headless Service J (`clusterIP: None`, `publishNotReadyAddresses`), which gives every pod the DNS
  name `<hostname>.J` before it is ready, as JAX's coordinator discovery needs;
- a ConfigMap J-slicekeeper holding the validated TrainingJob (`trainingjob.yaml`) and the inline
  policy (`policy.py`), mounted in every pod at /etc/slicekeeper for the supervisor;
- one pod per TPU host per slice, named `J-s<slice>-w<worker>`, with the TPU node selector, the
  `google.com/tpu` limit and toleration, hostname and subdomain, the TPU_* and MEGASCALE_* worker
  environment (GKE sets these only for Indexed Jobs and JobSets, never for bare pods), slice
  affinity on the node pool, optional Kueue pod-group labels, `restartPolicy: Never`, the
  termination grace period of `spec.disruption`, and the supervisor as the container entrypoint
  wrapping the user's command.

Manifests are plain dicts in the API's JSON shape: a 25,000-host job renders one pod at a time
(`pods()` is a generator), and nothing here talks to a cluster. Owner references need the live
object's uid, so the operator adds them (`kopf.adopt`) and `render` leaves them out.

The pod environment is the job's full, static identity. After a scale-down the supervisor tells its
workload the smaller world (rank, world size, MEGASCALE_* of the slices taking part) when it starts
each generation, so a surviving pod is never re-created to change its environment.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import yaml

from slicekeeper import protocol, tpu
from slicekeeper.api import TrainingJob, cluster_layout, dump_training_job
from slicekeeper.credentials import JobCredentials
from slicekeeper.shape import HostId, JobLayout

Manifest = dict[str, Any]

GROUP = "slicekeeper.dev"
LABEL_JOB = protocol.LABEL_JOB
LABEL_SLICE = f"{GROUP}/slice"
LABEL_WORKER = f"{GROUP}/worker"
LABEL_HOST = f"{GROUP}/host"
"""The host's index in the full job (slice x hosts per slice + worker): its shard, for life."""

NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""Every namespace carries its own name in this label (Kubernetes 1.22 and later)."""
ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
TPU_RESOURCE = "google.com/tpu"

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"

CONFIG_DIR = protocol.CONFIG_DIR
CREDENTIALS_DIR = protocol.CREDENTIALS_DIR
CONFIG_JOB_KEY = protocol.CONFIG_JOB_FILE
CONFIG_POLICY_KEY = protocol.CONFIG_POLICY_FILE
USER_POLICY_DIR = f"{CONFIG_DIR}/{protocol.CONFIG_USER_POLICY_DIR}"
CONTAINER = "training"

PORTS = {
    "tpu-runtime": 8471,
    "jax-coord": 8476,
    "megascale": 8080,
    "sk-coord": protocol.SUPERVISOR_PORT,
    "metrics": protocol.METRICS_PORT,
}
"""Container ports: the TPU runtime's, JAX's coordinator, megascale (DCN), the supervisors' own
coordination (the leader listens there) and their Prometheus endpoint."""


def pod_name(job_name: str, slice_index: int, worker: int) -> str:
    return f"{job_name}-s{slice_index}-w{worker}"


def credentials_secret_name(job_name: str) -> str:
    """The job's credentials (slicekeeper.credentials): made by the operator, never rendered."""
    return f"{job_name}-credentials"


def config_map_name(job_name: str) -> str:
    return f"{job_name}-slicekeeper"


@dataclass(frozen=True)
class RenderedJob:
    """The children of one TrainingJob; `pods()` yields them one at a time."""

    job: TrainingJob
    layout: JobLayout
    policy_source: str | None
    """The policy's Python source, stored in the ConfigMap; None for the default policy or a
    user ConfigMap (`spec.policy.configMap`), which pods mount as it is."""

    @property
    def name(self) -> str:
        return self.job.metadata.name

    @cached_property
    def _tpu_slice(self) -> tpu.SliceShape:
        """One slice's hardware, resolved once: resolving it for each pod was half of a pod's
        rendering (37 us a pod before, 17 after, at 25,000 hosts: `python -m benchmarks.render_cost`)."""
        return self.job.slice_shape

    @cached_property
    def _worker_hostnames(self) -> dict[int, str]:
        """TPU_WORKER_HOSTNAMES of each slice rendered so far: the same for the slice's every pod."""
        return {}

    @property
    def namespace(self) -> str | None:
        return self.job.metadata.namespace

    def _metadata(self, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": name, "labels": {LABEL_JOB: self.name, **(labels or {})}}
        if self.namespace:
            metadata["namespace"] = self.namespace
        return metadata

    def service(self) -> Manifest:
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self._metadata(self.name),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {LABEL_JOB: self.name},
                "ports": [{"name": name, "port": port} for name, port in PORTS.items()],
            },
        }

    def network_policy(self) -> Manifest:
        """Only the job's own pods reach its pods (the supervisors' leader and peer ports, JAX's
        coordinator, the TPU runtime, megascale), and only `spec.network.metricsNamespace` the
        metrics port. Egress is left open: the persistent tier's bucket, DNS, the API server."""
        own_pods = {"podSelector": {"matchLabels": {LABEL_JOB: self.name}}}
        ingress: list[dict[str, Any]] = [{"from": [own_pods]}]
        monitoring = self.job.spec.network.metrics_namespace
        if monitoring is not None:
            scrapers = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: monitoring}}}
            metrics = {"protocol": "TCP", "port": PORTS["metrics"]}
            ingress.append({"from": [scrapers], "ports": [metrics]})
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": self._metadata(self.name),
            "spec": {
                "podSelector": {"matchLabels": {LABEL_JOB: self.name}},
                "policyTypes": ["Ingress"],
                "ingress": ingress,
            },
        }

    def config_map(self) -> Manifest:
        job = dump_training_job(self.job)
        job.pop("status", None)
        if self.policy_source is not None:  # the supervisors read it from policy.py, next to the job
            for key in ("file", "source"):
                job["spec"]["policy"].pop(key, None)
        data = {CONFIG_JOB_KEY: yaml.safe_dump(job, sort_keys=False)}
        if self.policy_source is not None:
            data[CONFIG_POLICY_KEY] = self.policy_source
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": self._metadata(config_map_name(self.name)),
            "data": data,
        }

    def credentials_secret(self, job_credentials: JobCredentials) -> Manifest:
        """The Secret of the job's credentials, mounted into its pods alone. Not among `manifests`:
        its content is made anew for each job by the operator (rendered output never holds a key)."""
        data = {name: base64.b64encode(content).decode() for name, content in job_credentials.files().items()}
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": self._metadata(credentials_secret_name(self.name)),
            "type": "kubernetes.io/tls",
            "immutable": True,
            "data": data,
        }

    def pods(self, slices: Iterable[int] | None = None) -> Iterator[Manifest]:
        """The pods of `slices` (default: every slice of the job), slice by slice, worker by worker."""
        shape = self.layout.shape
        for slice_index in range(shape.slices) if slices is None else sorted(slices):
            if not 0 <= slice_index < shape.slices:
                raise ValueError(f"slice {slice_index} outside 0..{shape.slices - 1}")
            for host in shape.hosts_of(slice_index):
                yield self.pod(self.layout.host(host))

    def pod(self, host: HostId) -> Manifest:
        spec = self.job.spec
        shape = self._tpu_slice
        name = pod_name(self.name, host.slice, host.worker)
        labels = {LABEL_SLICE: str(host.slice), LABEL_WORKER: str(host.worker), LABEL_HOST: str(host.index)}
        metadata = self._metadata(name, labels)
        if spec.kueue is not None:
            metadata["labels"][KUEUE_QUEUE_LABEL] = spec.kueue.queue_name
            metadata["labels"][KUEUE_GROUP_LABEL] = self.name
            metadata["annotations"] = {KUEUE_COUNT_ANNOTATION: str(self.layout.shape.host_count)}
        chips = str(shape.chips_per_host)
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": {
                "hostname": name,
                "subdomain": self.name,
                "restartPolicy": "Never",
                # How long a supervisor told to stop (SIGTERM: a preemption, a drain) has to save the
                # step and hand its host over; also the `at` of a preemption notice (operator/notices.py).
                "terminationGracePeriodSeconds": spec.disruption.termination_grace_period_seconds,
                "serviceAccountName": spec.service_account_name,
                "nodeSelector": {ACCELERATOR_LABEL: shape.accelerator, TOPOLOGY_LABEL: shape.topology},
                "tolerations": [{"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
                "affinity": self._slice_affinity(host.slice),
                # The "restricted" Pod Security Standard (docs/security.md): the image's user must be
                # a non-root number (the slicekeeper image's is 10001); TPU chips need no privilege
                # on GKE 1.28 and later (the device plugin hands the container /dev/accel*).
                "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [
                    {
                        "name": CONTAINER,
                        "image": spec.workload.image,
                        "command": ["python", "-m", "slicekeeper.supervisor", "--in-pod", "--"],
                        "args": [*spec.workload.command, *spec.workload.args],
                        "env": self._env(host),
                        "ports": [{"name": n, "containerPort": p} for n, p in PORTS.items()],
                        # A failed supervisor's last log lines (why it failed the job) become the
                        # container's termination message, which the job's Failed condition quotes.
                        "terminationMessagePolicy": "FallbackToLogsOnError",
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                        "resources": {"limits": {TPU_RESOURCE: chips}, "requests": {TPU_RESOURCE: chips}},
                        "volumeMounts": [
                            {"name": "slicekeeper-config", "mountPath": CONFIG_DIR, "readOnly": True},
                            {"name": "local-checkpoints", "mountPath": spec.checkpoint.local_dir},
                            {"name": "credentials", "mountPath": CREDENTIALS_DIR, "readOnly": True},
                            {"name": "compilation-cache", "mountPath": protocol.COMPILATION_CACHE_DIR},
                            *self._policy_mount(),
                        ],
                    }
                ],
                "volumes": [
                    {"name": "slicekeeper-config", "configMap": {"name": config_map_name(self.name)}},
                    *self._policy_volume(),
                    {"name": "local-checkpoints", "emptyDir": {"medium": "Memory"}},
                    self._compilation_cache_volume(),
                    {
                        "name": "credentials",
                        # Owner-readable only; the supervisor keeps the workload from them (workload
                        # confinement, docs/security.md).
                        "secret": {"secretName": credentials_secret_name(self.name), "defaultMode": 0o400},
                    },
                ],
            },
        }

    def _slice_affinity(self, slice_index: int) -> dict[str, Any]:
        """A slice's pods share one node pool (a multi-host slice is one); other slices keep off it."""
        same_slice = {"matchLabels": {LABEL_JOB: self.name, LABEL_SLICE: str(slice_index)}}
        other_slices = {
            "matchLabels": {LABEL_JOB: self.name},
            "matchExpressions": [{"key": LABEL_SLICE, "operator": "NotIn", "values": [str(slice_index)]}],
        }
        return {
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": same_slice, "topologyKey": NODE_POOL_LABEL}
                ]
            },
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": other_slices, "topologyKey": NODE_POOL_LABEL}
                ]
            },
        }

    def _compilation_cache_volume(self) -> dict[str, Any]:
        """The pod's own (a restart within it loads what it compiled), or the claim the job's pods
        share (a replacement loads what its predecessor compiled)."""
        claim = self.job.spec.workload.compilation_cache.claim_name
        if claim is None:
            return {"name": "compilation-cache", "emptyDir": {}}
        return {"name": "compilation-cache", "persistentVolumeClaim": {"claimName": claim}}

    def _policy_mount(self) -> list[dict[str, Any]]:
        if not self._policy_volume():
            return []
        return [{"name": "policy", "mountPath": USER_POLICY_DIR, "readOnly": True}]

    def _policy_volume(self) -> list[dict[str, Any]]:
        user_map = self.job.spec.policy.config_map
        if user_map is None or self.policy_source is not None:
            return []
        return [{"name": "policy", "configMap": {"name": user_map}}]

    def _env(self, host: HostId) -> list[dict[str, Any]]:
        layout, spec = self.layout, self.job.spec
        fqdn = f"{{}}.{self.name}"
        hostnames = self._worker_hostnames.get(host.slice)
        if hostnames is None:
            hostnames = ",".join(fqdn.format(h) for h in layout.slice_hostnames(host.slice))
            self._worker_hostnames[host.slice] = hostnames
        env = {
            protocol.ENV_TPU_WORKER_ID: str(host.worker),
            protocol.ENV_TPU_WORKER_HOSTNAMES: hostnames,
            protocol.ENV_TPU_NAME: f"{self.name}-s{host.slice}",
            protocol.ENV_HOST: str(host.index),
            protocol.ENV_CONFIG_DIR: CONFIG_DIR,
            protocol.ENV_CREDENTIALS_DIR: CREDENTIALS_DIR,
        }
        uid = (self.job.metadata.model_extra or {}).get("uid")
        if uid:  # (a job read from the API server; `slicekeeper render` of a file has none)
            env[protocol.ENV_JOB_UID] = str(uid)
        if layout.shape.slices > 1:
            env |= {
                protocol.ENV_MEGASCALE_NUM_SLICES: str(layout.shape.slices),
                protocol.ENV_MEGASCALE_SLICE_ID: str(host.slice),
                protocol.ENV_MEGASCALE_COORDINATOR_ADDRESS: fqdn.format(pod_name(self.name, 0, 0)),
                protocol.ENV_MEGASCALE_PORT: str(PORTS["megascale"]),
            }
        listed = [{"name": key, "value": value} for key, value in env.items()]
        fields = {
            protocol.ENV_POD_NAME: "metadata.name",
            protocol.ENV_POD_NAMESPACE: "metadata.namespace",
            protocol.ENV_POD_UID: "metadata.uid",
            protocol.ENV_POD_IP: "status.podIP",
            protocol.ENV_NODE_NAME: "spec.nodeName",
        }
        downward = [
            {"name": key, "valueFrom": {"fieldRef": {"fieldPath": path}}} for key, path in fields.items()
        ]
        user = [
            {"name": e.name, "value": e.value}
            for e in spec.workload.env
            if e.name not in env and e.name not in fields
        ]
        return listed + downward + user


class _ManifestDumper(yaml.SafeDumper):
    """Multi-line strings (the ConfigMap's files) as literal blocks, readable as they are."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_ManifestDumper.add_representer(str, _string)


def yaml_documents(documents: Iterable[Manifest]) -> str:
    """Manifests as one multi-document YAML stream, as `kubectl apply -f` reads them."""
    return yaml.dump_all(documents, Dumper=_ManifestDumper, sort_keys=False, explicit_start=True)


def render(job: TrainingJob, policy_source: str | None = None) -> RenderedJob:
    """The children of `job` in its cluster shape (every host a pod; `spec.local` is ignored)."""
    return RenderedJob(job, cluster_layout(job), policy_source)


def manifests(rendered: RenderedJob, slices: Iterable[int] | None = None) -> Iterator[Manifest]:
    """Every child, in the order to create them: Service, ConfigMap, NetworkPolicy, then the pods."""
    yield rendered.service()
    yield rendered.config_map()
    yield rendered.network_policy()
    yield from rendered.pods(slices)
