"""What a job's pod asks of the operator, and the writes that answer it: hot-swap, notice, or fail.

The pod events (operator/pod_informers.py), the node events and the jobs' timers (operator/
handlers.py) all decide here, in memory, and act through `Cluster`:

- a pod that failed, was deleted, or that its own supervisor marked for replacement is hot-swapped
  (operator/hot_swap.py): its plan is written on the job before the pod is deleted, so that an
  operator killed in between finishes it (operator/replacements.py), and a Kubernetes event says so
  on the job, posted before the create (`Cluster.post_event`);
- a supervisor exiting 1 means the job failed as a whole (its policy said so, or its budgets are
  spent): the job is marked Failed and nothing is replaced; a supervisor exiting 4 could not reach
  its leader in time: its pod is replaced, its node not avoided (nothing says the node is at fault);
- a pod whose image cannot run the supervisor (no slicekeeper in it, no `python`: operator/
  image_check.py) fails the job with a message naming the image: a replacement would run it again;
- a node that announces its own end (operator/notices.py) has the notice put on each job pod of its
  slice, and taken off again when it no longer says so.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, cast

import kopf
from slicekeeper.operator.cluster import Cluster
from slicekeeper.operator.hot_swap import (
    AVOID_ANNOTATION,
    host_of,
    replacement,
    replacement_reason,
    terminated_state,
)
from slicekeeper.operator.image_check import unusable_image
from slicekeeper.operator.job_bodies import job_of_body, where
from slicekeeper.operator.job_status import condition, with_condition
from slicekeeper.operator.log_summary import JobActivity
from slicekeeper.operator.notices import (
    DEFAULT_GRACE_SECONDS,
    NOTICE_ANNOTATION,
    NodeSignal,
    NoticesWritten,
    notice_change,
)
from slicekeeper.operator.pod_store import JobKey, NotListedYet, PodStore, PodSummary
from slicekeeper.operator.render import LABEL_JOB, LABEL_SLICE, render
from slicekeeper.operator.replacements import Plan, Replacements

from slicekeeper import protocol
from slicekeeper.api import TrainingJob

JOB_FAILED_EXIT_CODE = protocol.EXIT_JOB_FAILED
"""The in-pod supervisor's exit code when the job failed as a whole (slicekeeper.errors.JobFailed)."""
LEADER_UNREACHABLE_EXIT_CODE = protocol.EXIT_LEADER_UNREACHABLE
"""The in-pod supervisor's exit code when it could not reach the job's leader within
spec.health.replacementTimeoutSeconds (supervisor/leader_connection.py): replace the pod, and do not
blame its node. Any other failure of a pod is replaced too, away from its node."""
NODE_NOT_READY = "its node is not ready"
LEADER_UNREACHABLE = (
    "its supervisor could not reach the job's leader within spec.health.replacementTimeoutSeconds"
)
logger = logging.getLogger(__name__)


class PodActions:
    """The operator's answers to its jobs' pods, shared by every handler (and their threads)."""

    def __init__(self, cluster: Cluster, store: PodStore, activity: JobActivity) -> None:
        self.cluster, self.store, self.activity = cluster, store, activity
        self.replacing = Replacements()
        self._failed: set[str | None] = set()
        """The uids of the jobs this operator marked Failed."""
        self._failing = threading.Lock()
        self._notices = NoticesWritten()
        self._noticing = threading.Lock()
        """Held across a notice's read, decision and write: the timers and the node events race."""

    def action(self, owner: kopf.Body, pod: dict[str, Any]) -> Callable[[], None] | None:
        """What one of the job's pods, as it is now, asks of the operator (None: nothing): fail the
        job (its image cannot run the supervisor, or its supervisor failed the job), or replace the
        pod (unless its hot-swap has begun: the pod's events and the job's listing both ask)."""
        unusable = unusable_image(pod)
        if unusable is not None:  # a replacement would start the same image again
            return partial(self.fail, owner, unusable)
        terminated = terminated_state(pod) or {}
        name = str(pod["metadata"]["name"])
        if terminated.get("exitCode") == JOB_FAILED_EXIT_CODE:
            message = terminated.get("message") or f"pod {name}'s supervisor failed the job"
            return partial(self.fail, owner, message)
        reason = LEADER_UNREACHABLE if left_for_its_leader(pod) else replacement_reason(pod)
        if reason is None or self.replacing.begun(where(owner), name, pod["metadata"].get("uid")):
            return None
        return partial(self.replace, where(owner), owner.get("status") or {}, {name: plan_for(pod, reason)})

    def replace(self, job: JobKey, status: Mapping[str, Any], plans: dict[str, Plan]) -> None:
        """Begin replacing the job's pods `plans` names: the plans onto the job first (those its
        `status` does not hold already: an operator restarted after recording them finishes them),
        then the deletes (each pod's DELETED event creates its replacement: `recreate`)."""
        namespace, name = job
        patch, to_delete = self.replacing.begin(job, plans, status)
        try:
            if patch:
                self.cluster.patch_job_status(namespace, name, patch)
            for pod_name in to_delete:
                self.cluster.delete_pod(namespace, pod_name)
                self.store.deleted(namespace, name, pod_name, plans[pod_name].uid)
                logger.debug(
                    "pod %s/%s deleted to be replaced: %s", namespace, pod_name, plans[pod_name].reason
                )
        except Exception:
            self.replacing.abandon(job, {pod_name: plans[pod_name] for pod_name in to_delete})
            raise

    def recreate(self, owner: kopf.Body, pod: dict[str, Any]) -> None:
        """A job pod was deleted: create its replacement, as planned when the operator deleted it,
        else (a user, a node's removal) replacing the pod as it last was."""
        job_key, pod_name = where(owner), str(pod["metadata"]["name"])
        plan = self.replacing.plans(job_key, owner.get("status") or {}).get(pod_name)
        if plan is None or plan.uid != pod["metadata"].get("uid"):
            reason = LEADER_UNREACHABLE if left_for_its_leader(pod) else "it was deleted"
            plan = plan_for(pod, reason)
        self.create_replacement(owner, job_of_body(owner), pod_name, host_of(pod), plan)

    def create_replacement(self, owner: kopf.Body, job: TrainingJob, name: str, host: int, plan: Plan) -> int:
        """Create pod `name` (host `host`) as `plan` says; 1 if created, 0 if it was there already.
        Its `HotSwap` event is posted first: an operator killed after it creates the pod on its
        restart (and says so again); one killed after the create has said it."""
        job_key = where(owner)
        if not self.replacing.claim(job_key, name, plan):
            return 0  # (the timer and the DELETED event's handler both found it missing)
        rendered = render(job, job.spec.policy.source)
        fresh = replacement(
            rendered, host, plan.avoid_nodes, self.store.announcing(), hot_swaps=plan.hot_swaps
        )
        fresh["metadata"]["namespace"] = job_key[0]
        kopf.adopt(fresh, owner=owner, strict=False)
        avoided = fresh["metadata"]["annotations"].get(AVOID_ANNOTATION, "none")
        message = f"pod {name} replaced ({plan.reason}); avoiding nodes: {avoided}"
        try:
            self.cluster.post_event(owner, warning=True, reason="HotSwap", message=message)
            if not self.cluster.create(fresh):  # (a retried handler)
                return 0
        except Exception:
            self.replacing.release(job_key, name, plan)  # the next to find it missing tries again
            raise
        self.cluster.metrics.hot_swaps.labels(namespace=job_key[0]).inc()
        self.activity.note(job_key, "pods replaced")
        return 1

    def slice_signals(self, pods: list[dict[str, Any]]) -> dict[str | None, tuple[bool, NodeSignal | None]]:
        """Per slice of the job, what its nodes announce: a host event on one VM of a multi-host TPU
        slice interrupts the whole slice (docs/operations.md), so each of its pods gets the notice of
        the first of its nodes that announces one. Seen: a node of the slice announces, or every node
        of it was seen (no notice is taken off on the word of a node not seen yet)."""
        found: dict[str | None, tuple[bool, NodeSignal | None]] = {}
        for pod in pods:
            seen, signal = self.store.node_signal(pod["spec"]["nodeName"])
            all_seen, first = found.get(slice_of(pod), (True, None))
            found[slice_of(pod)] = (all_seen and seen, first or signal)
        return {part: (all_seen or signal is not None, signal) for part, (all_seen, signal) in found.items()}

    def with_slice_mates(self, pods: list[PodSummary]) -> list[PodSummary]:
        """`pods` and the other pods of their slices, at once: a host event on one VM of a multi-host
        slice interrupts the whole slice. Left to the jobs' timers, the mates' notices came at the
        next look, by when the announcing host could be retired and its pod re-created elsewhere,
        its slice then announcing nothing: the job ran on with the mates never told (seen in the
        operator's maintenance test on a loaded machine)."""
        slices = {(job_of(pod), slice_of(pod)) for pod in pods if slice_of(pod) is not None}
        found = {pod["metadata"]["uid"]: pod for pod in pods}
        for (namespace, job), part in sorted(slices, key=str):
            try:
                mates = self.store.pods(namespace, job, timeout=0)
            except NotListedYet:
                continue  # (the jobs' timers extend the notice once the pods are listed)
            found.update((mate["metadata"]["uid"], mate) for mate in mates if slice_of(mate) == part)
        return list(found.values())

    def give_notice(self, pod: dict[str, Any], signal: NodeSignal | None) -> None:
        """Put the notice of `signal` on the pod (or take its notice off: None), unless it says so.
        `pod` may be an older summary than the store's: the store's latest is read, and the
        operator's own writes its watch has not shown yet count as the pod's (`NoticesWritten`)."""
        with self._noticing:
            latest = self.store.latest(pod)
            if latest is None:
                return  # (gone since)
            metadata = latest["metadata"]
            now = time.time()
            seen = (metadata.get("annotations") or {}).get(NOTICE_ANNOTATION)
            grace = latest["spec"].get("terminationGracePeriodSeconds")
            change = notice_change(
                signal,
                self._notices.current(metadata["uid"], seen, now=now),
                grace_seconds=DEFAULT_GRACE_SECONDS if grace is None else grace,
                now=now,
            )
            if change is None:
                return
            if self.cluster.annotate_pod(
                metadata["namespace"], metadata["name"], {NOTICE_ANNOTATION: change.value}
            ):
                self._notices.wrote(metadata["uid"], change.value, now=now)
        self.activity.note(job_of(pod), "notices given" if change.value else "notices withdrawn")
        logger.debug(
            "pod %s/%s: notice %s", metadata["namespace"], metadata["name"], change.value or "withdrawn"
        )

    def fail(self, owner: kopf.Body, message: str) -> None:
        """Mark the job Failed, once (its listing and its pods' events may both tell of it)."""
        with self._failing:
            if owner.metadata.get("uid") in self._failed:
                return
        conditions = list((owner.get("status") or {}).get("conditions") or [])
        verdict = condition("Failed", "True", "JobFailed", message)
        self.cluster.patch_job_status(
            *where(owner), {"phase": "Failed", "conditions": with_condition(conditions, verdict)}
        )
        kopf.event(owner, type="Warning", reason="JobFailed", message=message)
        with self._failing:  # (after the patch: a failed one is tried again)
            self._failed.add(owner.metadata.get("uid"))


def job_of(pod: dict[str, Any]) -> JobKey:
    """(namespace, job name) of one of a job's pods (the job's label)."""
    metadata = pod["metadata"]
    return str(metadata["namespace"]), str(metadata["labels"][LABEL_JOB])


def slice_of(pod: dict[str, Any]) -> str | None:
    """The slice a pod of the job serves (its label), None for one without it."""
    return cast(str | None, ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_SLICE))


def plan_for(pod: dict[str, Any], reason: str) -> Plan:
    """How to replace `pod` (a pod or its summary): away from its node, unless its supervisor left
    because it could not reach its leader (nothing says its node is at fault)."""
    return Plan.of(pod, reason, node_at_fault=not left_for_its_leader(pod))


def left_for_its_leader(pod: dict[str, Any]) -> bool:
    """The pod's supervisor ended because it could not reach the leader (LEADER_UNREACHABLE_EXIT_CODE)."""
    return (terminated_state(pod) or {}).get("exitCode") == LEADER_UNREACHABLE_EXIT_CODE
