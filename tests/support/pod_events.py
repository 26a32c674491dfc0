"""What the workloads in the fake kubelet's pods wrote to their event logs, read as it is written.

The job's status shows a step only when the leader next publishes its view (every 5 s); a pod's event
log shows it at once. Tests that must act while a job is at a given step (disrupt it, suspend it)
read the logs, so that a fast job has not run past the step by the time they act."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from tests.support.fake_kubelet import FakeTpuCluster


def workload_events(cluster: FakeTpuCluster, pod_uid: str = "*") -> Iterator[dict[str, Any]]:
    """What the workloads said in their pods' event logs (of the pod whose uid is `pod_uid`, or of
    every pod); a line still being written is skipped."""
    for log in cluster.workdir.glob(f"pods/{pod_uid}/run-dir/*/events.jsonl"):
        for line in log.read_text().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("source") == "workload":
                    yield record


def steps_ended(cluster: FakeTpuCluster, generation: int = 0, pod_uid: str = "*") -> int:
    """The furthest step any pod's workload (or the pod `pod_uid`'s) has ended in `generation` or a
    later one (0: none)."""
    ended = [
        int(record["step"])
        for record in workload_events(cluster, pod_uid)
        if record.get("type") == "step_end" and int(record.get("generation", 0)) >= generation
    ]
    return max(ended, default=0)
