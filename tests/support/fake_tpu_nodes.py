"""Make a kind cluster's worker nodes look like GKE TPU slice nodes, so the operator's pods schedule.

kind has no TPUs. The operator's pods select TPU nodes the GKE way (REFERENCES sec. 1,
operator/render.py): `nodeSelector` on `cloud.google.com/gke-tpu-accelerator` and
`cloud.google.com/gke-tpu-topology`, a `google.com/tpu` request of the chips per host, a toleration
of the `google.com/tpu` NoSchedule taint, and slice affinity on `cloud.google.com/gke-nodepool` (a
multi-host slice is one node pool). This script gives kind workers exactly that: the labels (values
taken from the job's own rendered pods, so they cannot drift from render.py), the taint, and the
`google.com/tpu` extended resource in the node's status capacity (a JSON patch on the `status`
subresource, the documented way to advertise an extended resource).

Layout: one fake node pool per slice, each with the slice's hosts plus `--spares-per-pool` spare
nodes (default 1). The spare is what a hot-swap lands on: a replacement pod must stay in its slice's
pool (the slice affinity) and off the node it failed on, and each node has room for one TPU pod.
One more worker must stay plain (no taint): the operator's Deployment runs there, since kind's
control-plane node is tainted too. Workers are taken in name order; running it again is harmless.

    python tests/support/fake_tpu_nodes.py                 # for examples/trainingjob.yaml
    python tests/support/fake_tpu_nodes.py my-job.yaml --dry-run

Uses the current kubeconfig context (KUBECONFIG or ~/.kube/config; `--context` to choose). See
docs/kind.md.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
from slicekeeper.operator.render import (
    ACCELERATOR_LABEL,
    NODE_POOL_LABEL,
    TOPOLOGY_LABEL,
    TPU_RESOURCE,
    render,
)

from slicekeeper.api import TrainingJob, load_training_job

EXAMPLE = Path(__file__).parents[2] / "examples" / "trainingjob.yaml"
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
TPU_TAINT = {"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
"""The taint GKE puts on TPU nodes; the operator's pods tolerate `google.com/tpu` (any value)."""
POOL_PREFIX = "kind-tpu-pool-"


@dataclass(frozen=True)
class FakeTpuNode:
    name: str
    pool: str
    labels: dict[str, str] = field(default_factory=dict)
    capacity: dict[str, str] = field(default_factory=dict)
    taint: dict[str, str] = field(default_factory=lambda: dict(TPU_TAINT))

    def describe(self) -> str:
        taint = f"{self.taint['key']}={self.taint['value']}:{self.taint['effect']}"
        return f"{self.name}: pool {self.pool}, labels {self.labels}, capacity {self.capacity}, taint {taint}"


def _natural(name: str) -> list[Any]:
    """kind-worker, kind-worker2, ..., kind-worker10 in that order."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def plan(job: TrainingJob, workers: list[str], spares_per_pool: int = 1) -> list[FakeTpuNode]:
    """Which workers become which fake TPU nodes for `job` (raises ValueError when too few)."""
    pod = next(render(job).pods())
    selector: dict[str, str] = pod["spec"]["nodeSelector"]
    chips = str(pod["spec"]["containers"][0]["resources"]["limits"][TPU_RESOURCE])
    per_pool = job.slice_shape.host_count + spares_per_pool
    needed = job.spec.slices * per_pool
    ordered = sorted(workers, key=_natural)
    if len(ordered) < needed + 1:
        raise ValueError(
            f"{job.metadata.name} needs {needed} fake TPU nodes ({job.spec.slices} pools of "
            f"{job.slice_shape.host_count} hosts + {spares_per_pool} spare) and one plain worker for the "
            f"operator: {needed + 1} kind workers, found {len(ordered)}; add workers to the kind config"
        )
    nodes = []
    for index, name in enumerate(ordered[:needed]):
        pool = f"{POOL_PREFIX}{index // per_pool}"
        labels = {
            ACCELERATOR_LABEL: selector[ACCELERATOR_LABEL],
            TOPOLOGY_LABEL: selector[TOPOLOGY_LABEL],
            NODE_POOL_LABEL: pool,
        }
        nodes.append(FakeTpuNode(name=name, pool=pool, labels=labels, capacity={TPU_RESOURCE: chips}))
    return nodes


def _escape(key: str) -> str:
    """A JSON pointer token (RFC 6901): `google.com/tpu` is `google.com~1tpu`."""
    return key.replace("~", "~0").replace("/", "~1")


def apply(core: Any, nodes: list[FakeTpuNode], timeout: float = 60.0) -> None:
    """Label, taint and patch the status of each node, then wait until the scheduler can use it."""
    for node in nodes:
        current = core.api_client.sanitize_for_serialization(core.read_node(node.name))
        core.patch_node(node.name, {"metadata": {"labels": node.labels}})
        taints = list(current.get("spec", {}).get("taints") or [])
        if not any(t["key"] == node.taint["key"] and t["effect"] == node.taint["effect"] for t in taints):
            core.patch_node(node.name, {"spec": {"taints": [*taints, node.taint]}})
        operations = [
            {"op": "add", "path": f"/status/capacity/{_escape(resource)}", "value": amount}
            for resource, amount in node.capacity.items()
        ]
        core.patch_node_status(node.name, operations, _content_type="application/json-patch+json")
        print(node.describe())
    deadline = time.monotonic() + timeout
    waiting = {node.name: node for node in nodes}
    while waiting:
        for name, node in list(waiting.items()):
            status = core.api_client.sanitize_for_serialization(core.read_node(name)).get("status", {})
            allocatable = status.get("allocatable") or {}
            if all(str(allocatable.get(r)) == amount for r, amount in node.capacity.items()):
                del waiting[name]
        if waiting and time.monotonic() > deadline:
            raise RuntimeError(f"{sorted(waiting)}: {TPU_RESOURCE} not allocatable after {timeout:.0f} s")
        if waiting:
            time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("job", nargs="?", type=Path, default=EXAMPLE, help="the TrainingJob to make room for")
    parser.add_argument("--spares-per-pool", type=int, default=1, help="spare nodes per pool (hot-swaps)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    args = parser.parse_args(argv)
    kubernetes.config.load_kube_config(context=args.context)
    core = kubernetes.client.CoreV1Api()
    listed = core.api_client.sanitize_for_serialization(core.list_node())["items"]
    workers = [n["metadata"]["name"] for n in listed if CONTROL_PLANE_LABEL not in n["metadata"]["labels"]]
    try:
        nodes = plan(load_training_job(args.job), workers, args.spares_per_pool)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        for node in nodes:
            print(node.describe())
        return 0
    apply(core, nodes)
    plain = sorted(set(workers) - {n.name for n in nodes}, key=_natural)
    print(f"plain workers (the operator runs there): {', '.join(plain)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
