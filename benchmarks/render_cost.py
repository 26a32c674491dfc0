"""What one pod of a large TrainingJob costs the operator before it reaches the wire: rendering its
manifest, adopting it (kopf's owner reference) and encoding the request body.

Why it exists: the operator creates a 25,000-host job's pods from creating threads that share one
interpreter (operator/creation.py), so every microsecond of CPU a pod costs there is paid 25,000 times
under the interpreter lock, while the creates wait for it. benchmarks/operator_scale.py measures the
whole (`cpu_ms_per_pod`); this measures the parts that are ours, one at a time, on this process
alone, so that a change to the renderer shows as a number rather than as noise in a 3-minute run.

How: the scale benchmark's job (benchmarks/operator_scale_job.py, the example job resized) is
rendered pod by pod as the operator renders it (a generator: nothing is kept, as in the operator),
`repeats` times; each stage is timed over every pod and the best repeat is kept (the least disturbed
by other work on the machine). Encoding is timed both ways the operator could do it: the standard
library's `json.dumps`, and orjson, which `Cluster.create` uses.

    .venv/bin/python -m benchmarks.render_cost [--hosts 25000] [--repeats 3]

Prints a line per stage (microseconds per pod) and one JSON line: `hosts`, `render_us`, `adopt_us`,
`json_us`, `orjson_us`, `bytes_per_pod`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import kopf
import orjson
from slicekeeper.operator.render import RenderedJob, render

from benchmarks.operator_scale_job import job_manifest, shape_for
from slicekeeper.api import parse_training_job

OWNER_UID = "00000000-0000-4000-8000-000000000000"


def rendered(hosts: int) -> tuple[RenderedJob, dict[str, Any]]:
    """The job of `hosts` hosts as the operator renders it, and its body as the API server holds it."""
    body = job_manifest(shape_for(hosts))
    body["metadata"]["uid"] = OWNER_UID
    job = parse_training_job(body, "the benchmark's job")
    return render(job, job.spec.policy.source), body


def per_pod(pods: Callable[[], Iterator[dict[str, Any]]], stage: Callable[[dict[str, Any]], object]) -> float:
    """Microseconds a pod of `stage` alone, timed around each call."""
    count, spent = 0, 0.0
    for pod in pods():
        start = time.perf_counter()
        stage(pod)
        spent += time.perf_counter() - start
        count += 1
    return spent / count * 1e6


def measure(hosts: int, repeats: int) -> dict[str, Any]:
    job, body = rendered(hosts)
    first = next(job.pods())
    best: dict[str, float] = {}
    for _ in range(repeats):
        start = time.perf_counter()
        count = sum(1 for _ in job.pods())
        stages = {"render_us": (time.perf_counter() - start) / count * 1e6}
        stages["adopt_us"] = per_pod(job.pods, lambda pod: kopf.adopt(pod, owner=body, strict=False))
        stages["json_us"] = per_pod(job.pods, json.dumps)
        stages["orjson_us"] = per_pod(job.pods, orjson.dumps)
        best = {key: min(value, best.get(key, value)) for key, value in stages.items()}
    return {
        "hosts": count,
        **{k: round(v, 1) for k, v in best.items()},
        "bytes_per_pod": len(orjson.dumps(first)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=25_000, help="the job's TPU hosts (default 25,000)")
    parser.add_argument("--repeats", type=int, default=3, help="walks of every pod; the best is kept")
    args = parser.parse_args(argv)
    if args.hosts < 1 or args.repeats < 1:
        parser.error("--hosts and --repeats must be at least 1")
    figures = measure(args.hosts, args.repeats)
    for stage in ("render_us", "adopt_us", "json_us", "orjson_us"):
        print(f"{stage.removesuffix('_us'):>7}: {figures[stage]:7.1f} us a pod")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
