"""The TrainingJob of the operator scale benchmark (benchmarks/operator_scale.py): a job size in TPU hosts
as a v5p slice shape, and the example job resized to it.

Its own module: the shape arithmetic and the manifest are what the benchmark's figures are about,
and they do not depend on the emulator or the operator's process.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from slicekeeper.api import parse_training_job

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "trainingjob.yaml"
NAMESPACE = "bench"
CHIPS_PER_HOST = 4  # v5p
MAX_HOSTS_PER_SLICE = 16


@dataclass(frozen=True)
class Shape:
    tpu_type: str
    slices: int
    hosts_per_slice: int

    @property
    def hosts(self) -> int:
        return self.slices * self.hosts_per_slice


def shape_for(hosts: int) -> Shape:
    """`hosts` 4-chip v5p hosts as slices of the largest power-of-two host count up to 16 dividing it."""
    per_slice = 1
    while per_slice * 2 <= MAX_HOSTS_PER_SLICE and hosts % (per_slice * 2) == 0:
        per_slice *= 2
    return Shape(f"v5p-{2 * CHIPS_PER_HOST * per_slice}", hosts // per_slice, per_slice)


def job_manifest(shape: Shape) -> dict[str, Any]:
    """The example TrainingJob, resized to `shape`, in the benchmark's namespace."""
    job: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    job["metadata"] = {"name": f"scale-{shape.hosts}", "namespace": NAMESPACE}
    job["spec"]["tpu"] = {"type": shape.tpu_type}
    job["spec"]["slices"] = shape.slices
    job["spec"].pop("local", None)  # the local runtime's settings: no part of the cluster's job
    model = parse_training_job(job, "the benchmark's job")
    if model.total_hosts != shape.hosts or model.slice_shape.chips_per_host != CHIPS_PER_HOST:
        raise SystemExit(f"{shape} renders {model.total_hosts} hosts, not {shape.hosts}")
    return job
