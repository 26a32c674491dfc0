"""Hot-swaps begun and not finished yet, written on the TrainingJob before the pod goes.

A replacement pod carries its host's history: the nodes the host failed on (it is kept off them) and
how often it was replaced (`status.restarts.replace` sums it). That history lives on the pod being
replaced. When the operator replaces a pod itself (it failed, its supervisor asked, its node is
NotReady) it deletes the pod, and its DELETED event creates the replacement; an operator killed
between the delete and the create came back to a pod simply missing, and created it afresh: on the
faulty node's reach again and its count reset, a hot-swap lost.

So the operator writes the plan first: `status.replacing[pod name] = {uid, avoidNodes, hotSwaps,
reason}` on the job (one status patch), then deletes. Whoever creates the pod next (the DELETED event's
handler, or the timer or the resume handler finding it missing) creates the replacement the plan
describes. The job's timer takes a plan off (`null` in its next status patch, usually one it makes
anyway) once the pod it names is there again, or is no longer one being replaced.

The plans are held in memory as well, from before the status patch is sent: the handlers read the
job's status from kopf's copy of the job, which can lag behind the operator's own patch.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slicekeeper.operator.hot_swap import HOT_SWAPS_ANNOTATION, avoided_nodes

JobKey = tuple[str, str]
"""(namespace, job name)."""
STATUS_KEY = "replacing"
"""The key of the TrainingJob's status the plans are written under."""


@dataclass(frozen=True)
class Plan:
    """What the replacement of one pod carries: the pod it replaces (`uid`), the nodes to keep off,
    its hot-swap count, and why (said in the `HotSwap` event)."""

    uid: str | None
    avoid_nodes: tuple[str, ...]
    hot_swaps: int
    reason: str

    @classmethod
    def of(cls, pod: Mapping[str, Any], reason: str, *, node_at_fault: bool = True) -> Plan:
        """The plan to replace `pod` (a pod or its summary): its node joins the nodes avoided unless
        it is not at fault (a supervisor that could not reach its leader)."""
        if not node_at_fault:
            pod = {**pod, "spec": {**(pod.get("spec") or {}), "nodeName": None}}
        metadata = pod.get("metadata") or {}
        swaps = int((metadata.get("annotations") or {}).get(HOT_SWAPS_ANNOTATION, 0)) + 1
        return cls(metadata.get("uid"), tuple(avoided_nodes(dict(pod))), swaps, reason)

    def record(self) -> dict[str, Any]:
        """The plan as the job's status holds it."""
        return {
            "uid": self.uid,
            "avoidNodes": list(self.avoid_nodes),
            "hotSwaps": self.hot_swaps,
            "reason": self.reason,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Plan:
        return cls(
            record.get("uid"),
            tuple(record.get("avoidNodes") or ()),
            int(record.get("hotSwaps") or 1),
            str(record.get("reason") or "a replacement begun before the operator restarted"),
        )


def recorded(status: Mapping[str, Any]) -> dict[str, Plan]:
    """The plans a job's status holds, by pod name."""
    records = status.get(STATUS_KEY) or {}
    return {name: Plan.from_record(record) for name, record in records.items() if record}


class Replacements:
    """The plans this operator began, by job and pod, until the job's timer sees them done."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._begun: dict[JobKey, dict[str, Plan]] = {}
        self._claimed: dict[tuple[JobKey, str], Plan] = {}
        """The plan whose pod was last created (or is being created), per job and pod."""
        self._taken_off: set[tuple[JobKey, str, Plan]] = set()

    def begin(
        self, job: JobKey, plans: Mapping[str, Plan], status: Mapping[str, Any]
    ) -> tuple[dict[str, Any], list[str]]:
        """Hold `plans` (pod name -> plan). Returns the status patch that records on the job those
        neither its `status` holds already nor were begun here before (empty: none), and the pods to
        delete: all but those begun here before (another caller deletes them)."""
        on_job = recorded(status)
        with self._lock:
            begun = self._begun.setdefault(job, {})
            fresh = {name: plan for name, plan in plans.items() if begun.get(name) != plan}
            begun.update(fresh)
        new = {name: plan.record() for name, plan in fresh.items() if on_job.get(name) != plan}
        return ({STATUS_KEY: new} if new else {}), list(fresh)

    def abandon(self, job: JobKey, plans: Mapping[str, Plan]) -> None:
        """Their deletes failed: forget `plans`, so that the next event or listing begins them again."""
        with self._lock:
            begun = self._begun.get(job, {})
            for name, plan in plans.items():
                if begun.get(name) == plan:
                    del begun[name]

    def plans(self, job: JobKey, status: Mapping[str, Any]) -> dict[str, Plan]:
        """The job's plans: those recorded in `status` (a restarted operator's only source), and
        those begun here, which win (the status read may be older than their patch)."""
        with self._lock:
            return {**recorded(status), **self._begun.get(job, {})}

    def begun(self, job: JobKey, name: str, uid: str | None) -> bool:
        """A plan begun here is about to delete this pod (`uid`): nothing more to do for it."""
        with self._lock:
            plan = self._begun.get(job, {}).get(name)
            return plan is not None and plan.uid == uid

    def claim(self, job: JobKey, name: str, plan: Plan) -> bool:
        """True once per plan in this process: the one caller that creates its pod (the DELETED
        event's handler and the timer may both find the pod missing)."""
        with self._lock:
            if self._claimed.get((job, name)) == plan:
                return False
            self._claimed[(job, name)] = plan
            return True

    def release(self, job: JobKey, name: str, plan: Plan) -> None:
        """The claimed create failed: another caller may try."""
        with self._lock:
            if self._claimed.get((job, name)) == plan:
                del self._claimed[(job, name)]

    def settled(self, job: JobKey, pods: list[dict[str, Any]], status: Mapping[str, Any]) -> dict[str, None]:
        """The plans that are done: their pod is there again, as the replacement (another uid), or as
        the pod to replace, which no plan begun here is about to delete (the operator that recorded it
        stopped before its delete; the pod's events begin it again if it still needs replacing).
        Forgets them; the status patch that takes them off the job (empty: nothing to take off)."""
        present = {p["metadata"]["name"]: p["metadata"].get("uid") for p in pods}
        with self._lock:
            begun = self._begun.get(job, {})
            done = [
                name
                for name, plan in {**recorded(status), **begun}.items()
                if name in present and not (name in begun and present[name] == plan.uid)
            ]
            for name in done:
                begun.pop(name, None)
            if not begun:
                self._begun.pop(job, None)
        on_job = recorded(status)
        with self._lock:  # each record is taken off once: the job's copy read next may predate that
            self._taken_off = {
                record for record in self._taken_off if record[0] != job or on_job.get(record[1]) == record[2]
            }
            patch = {
                name: None
                for name in done
                if name in on_job and (job, name, on_job[name]) not in self._taken_off
            }
            self._taken_off |= {(job, name, on_job[name]) for name in patch}
        return patch

    def forget_job(self, job: JobKey) -> None:
        with self._lock:
            self._begun.pop(job, None)
            self._claimed = {key: plan for key, plan in self._claimed.items() if key[0] != job}
            self._taken_off = {record for record in self._taken_off if record[0] != job}
