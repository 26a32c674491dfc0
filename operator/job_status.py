"""A TrainingJob's status, derived from its pods: what the operator's timer writes every few seconds.

Two sources, both on the pods (the operator never talks to the supervisors):

- the pods themselves: how many slices have every pod Running (`slicesReady`), how many times the
  operator replaced a host's pod (the `slicekeeper.dev/hot-swaps` annotation each replacement
  carries, summed into `restarts.replace`), whether every pod Succeeded;
- the leader's view (slicekeeper.leader_view), which the leading supervisor (slice 0 worker 0's at the
  start, any host's after a hand-over; the newest term's view counts) publishes on its own pod
  (annotation `slicekeeper.dev/status`, supervisor/pod/own_pod.py): the training step, the slices taking part
  (`slicesActive`, fewer after a scale-down), in-job restarts by kind, the newest restorable
  checkpoint step, goodput, and whether the job is restarting or finished.

A change in `slicesActive` is a remediation the leader carried out (its policy scaled the job down
because a replacement pod did not join in time, or back up when it did): the operator reports it as a
`ScaleDown` / `ScaleUp` event and keeps the `ScaledDown` condition true while the job runs on fewer
slices than it asked for. Pure functions: tested without an API server.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from slicekeeper.operator.hot_swap import HOT_SWAPS_ANNOTATION
from slicekeeper.operator.render import LABEL_SLICE, pod_name

from slicekeeper import leader_view as views
from slicekeeper import protocol
from slicekeeper.api import TrainingJob
from slicekeeper.leader_view import LeaderView

SCALE_EVENTS = {"ScaleDown": "down", "ScaleUp": "up"}
"""The reasons of the events a change of `slicesActive` posts, and the kind of scaling each says."""
COPIED = ("step", "slicesActive", "lastCheckpointStep", "lastRestore", "goodput", "paramsFingerprint")
"""What of the leader's view the TrainingJob's status shows as it is, when the view has it."""


@dataclass(frozen=True)
class JobEvent:
    """A Kubernetes event to post on the job."""

    reason: str
    message: str
    warning: bool = False


@dataclass
class DerivedStatus:
    status: dict[str, Any]
    """Merged into the TrainingJob's status."""
    events: list[JobEvent] = field(default_factory=list)


def now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": now()}


def with_condition(conditions: list[dict[str, Any]], new: dict[str, str]) -> list[dict[str, Any]]:
    """`conditions` with `new` in place of the one of its type; its transition time is kept when its
    status did not change."""
    old = next((c for c in conditions if c.get("type") == new["type"]), None)
    if old is not None and old.get("status") == new["status"]:
        new = {**new, "lastTransitionTime": old.get("lastTransitionTime") or new["lastTransitionTime"]}
    return [*(c for c in conditions if c.get("type") != new["type"]), new]


def leader_view(job: TrainingJob, pods: list[dict[str, Any]]) -> LeaderView | None:
    """What the job's leader last published on its pod, or None (not yet, or unreadable). Any host's
    supervisor may lead (the job's Lease elects it): the view of the newest term wins, so a leader
    replaced (and fenced) leaves a stale view behind that no longer counts."""
    found: list[tuple[int, bool, LeaderView]] = []
    for pod in pods:
        text = (pod["metadata"].get("annotations") or {}).get(protocol.ANNOTATION_STATUS)
        if not text:
            continue
        try:
            view = views.decode(text)
        except ValueError:
            continue
        first = pod["metadata"]["name"] == pod_name(str(job.metadata.name), 0, 0)
        found.append((view.get("term", 0), first, view))
    return max(found, key=lambda newest: newest[:2])[2] if found else None


def never_ran(pods: list[dict[str, Any]]) -> list[str]:
    """The names of the pods that never ran (e.g. a replacement still Pending): a job that is over
    deletes them, or one would start a supervisor for it once a node is free."""
    return [p["metadata"]["name"] for p in pods if _phase(p) in ("Pending", None)]


def _phase(pod: dict[str, Any]) -> str | None:
    return (pod.get("status") or {}).get("phase")


def _unschedulable(pods: list[dict[str, Any]]) -> list[str]:
    """`name: the scheduler's message` for each pod the scheduler could not place."""
    found = []
    for pod in pods:
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
                found.append(f"{pod['metadata']['name']}: {cond.get('message') or 'unschedulable'}")
    return found


def derive(job: TrainingJob, pods: list[dict[str, Any]], previous: dict[str, Any]) -> DerivedStatus:
    """The status to write, given the job's pods and the status it has now (`previous`)."""
    hosts_per_slice = job.slice_shape.host_count
    running: dict[str, int] = {}
    for pod in pods:
        if _phase(pod) == "Running":
            label = pod["metadata"]["labels"].get(LABEL_SLICE, "")
            running[label] = running.get(label, 0) + 1
    swaps = sum(int((p["metadata"].get("annotations") or {}).get(HOT_SWAPS_ANNOTATION, 0)) for p in pods)
    view = leader_view(job, pods) or LeaderView()
    status: dict[str, Any] = {
        "slicesReady": sum(1 for n in running.values() if n == hosts_per_slice),
        "slicesTotal": job.spec.slices,
        "restarts": {**(previous.get("restarts") or {}), **(view.get("restarts") or {}), "replace": swaps},
    }
    for key, value in view.items():
        if key in COPIED and value is not None:
            status[key] = value
    derived = DerivedStatus(status)
    state = view.get("state")
    every_pod_done = len(pods) == job.total_hosts and all(_phase(p) == "Succeeded" for p in pods)
    finished = state == "succeeded" or every_pod_done
    if finished:
        status["phase"] = "Succeeded"
    elif state == "stopping":
        status["phase"] = "Restarting"
    elif status["slicesReady"] >= min(view.get("slicesActive") or job.spec.slices, job.spec.slices):
        status["phase"] = "Running"
    _scaling(job, pods, previous, status, derived)
    return derived


def _scaling(
    job: TrainingJob,
    pods: list[dict[str, Any]],
    previous: dict[str, Any],
    status: dict[str, Any],
    derived: DerivedStatus,
) -> None:
    """The `ScaledDown` condition, and an event for each change in the slices taking part."""
    active = status.get("slicesActive")
    if active is None:
        return
    total = job.spec.slices
    before = previous.get("slicesActive") or total
    conditions = list(previous.get("conditions") or [])
    if active < total:
        waiting = _unschedulable(pods)
        why = f"; unschedulable: {'; '.join(waiting)}" if waiting else ""
        message = (
            f"training on {active} of {total} slices: a lost host's replacement pod did not join within "
            f"spec.health.replacementTimeoutSeconds ({job.spec.health.replacement_timeout_seconds:g} s)"
            f"{why}"
        )
        conditions = with_condition(conditions, condition("ScaledDown", "True", "NoCapacity", message))
    else:
        message = f"training on all {total} slices"
        conditions = with_condition(conditions, condition("ScaledDown", "False", "AllSlices", message))
    status["conditions"] = conditions
    if active < before:
        derived.events.append(JobEvent("ScaleDown", message, warning=True))
    elif active > before:
        derived.events.append(JobEvent("ScaleUp", f"capacity returned: {message}"))
