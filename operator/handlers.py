"""The kopf operator: TrainingJobs reconciled into TPU slice pods, and pods replaced when they fail.

Handlers, all idempotent (kopf retries them, and a restarted operator runs `resume` on every job):

- create / resume / update of a TrainingJob: re-validate the spec with the pydantic model (the CRD
  schema may have let something through); an invalid job gets phase and condition `Invalid` with the
  message, and no children. Otherwise create whichever children are missing (a 409 means the child
  is already there) and record `observedGeneration`.
- a timer per job (level-based): create what is missing, and derive the status from the pods and the
  leader's view published on its pod (operator/job_status.py): phase, slices ready/active/total,
  restarts by kind, step, checkpoint, goodput, scale-down and scale-up events. A pod deleted while
  the operator was down is re-created here.
- `spec.suspend: true`: the pods are deleted (the other children stay), phase Suspended; back to
  false, they are created again and the job resumes from its persistent checkpoint.
- pod events (job pods only, from the operator's own informers: operator/pod_informers.py): a pod
  that failed, was deleted, or that its own supervisor marked for replacement is hot-swapped, and a
  supervisor that failed the job, or an image that cannot run one, fails the job (operator/
  pod_actions.py decides and writes).
- node events: a NotReady node's job pods are hot-swapped (deleted, then re-created elsewhere). A
  node that announces its own end (a scheduled maintenance, an impending termination: operator/
  notices.py) gets the notice annotation put on each job pod bound to it, and taken off again when
  it no longer says so; the job's timer does the same for pods that reach such a node later.
- delete: the finalizer (kopf adds it for a non-optional delete handler) deletes the children.

The operator's metrics (operator/metrics.py) are read from the same state (jobs by phase from the
`jobs` index, pods by phase from the store) and counted where things happen: each handler's time,
each pod replaced, each scale event recorded; `Cluster` counts the API requests.

The handlers read pods and nodes from the operator's own store (operator/pod_store.py), kept by the
pod informers and the node event handler, never from a list request per run and never from kopf
indexes, whose filling makes a restarted operator quadratic in the pods. The only kopf index is
`jobs` (few objects). kopf watches the jobs and the nodes, not the pods (operator/informer.py: why).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import kopf
from slicekeeper.operator.cluster import LIST_PAGE_SIZE, PLURAL, VERSION, Cluster
from slicekeeper.operator.diffbase import JobsOnlyDiffBase
from slicekeeper.operator.hot_swap import host_of
from slicekeeper.operator.job_bodies import job_of_body, where
from slicekeeper.operator.job_status import SCALE_EVENTS, condition, derive, never_ran, with_condition
from slicekeeper.operator.log_summary import SUMMARY_SECONDS, JobActivity
from slicekeeper.operator.notices import announcement, node_signal
from slicekeeper.operator.pod_actions import NODE_NOT_READY, PodActions, job_of, plan_for, slice_of
from slicekeeper.operator.pod_informers import PodInformers
from slicekeeper.operator.pod_store import JobKey, NotListedYet, PodStore
from slicekeeper.operator.render import GROUP, LABEL_JOB, manifests, render
from slicekeeper.operator.replacements import Plan

from slicekeeper import credentials
from slicekeeper.api import TrainingJob
from slicekeeper.errors import UserError

STATUS_INTERVAL_SECONDS = 5.0
FIRST_LISTING_WAIT_SECONDS = 60.0
"""A job handler waits this long for the pods' first listing, then kopf runs it again a second later."""
logger = logging.getLogger(__name__)
FINAL_PHASES = ("Invalid", "Failed", "Succeeded")
OVER = ("Failed", "Succeeded")
"""A job that ran and is over: a pod of it that never ran is deleted."""


def _post(body: kopf.Body, *, reason: str, message: str) -> None:
    """A Normal Kubernetes event on the job (posted whatever `settings.posting.level` says)."""
    kopf.event(body, type="Normal", reason=reason, message=message)


def _post_warning(body: kopf.Body, *, reason: str, message: str) -> None:
    kopf.event(body, type="Warning", reason=reason, message=message)


def _validated(body: kopf.Body, patch: kopf.Patch) -> TrainingJob | None:
    """The job, or None after marking it Invalid (the message names every bad field)."""
    try:
        return job_of_body(body)
    except UserError as error:
        patch.status["phase"] = "Invalid"
        patch.status["conditions"] = [condition("Invalid", "True", "InvalidSpec", str(error))]
        patch.status["observedGeneration"] = body.metadata.get("generation")
        _post_warning(body, reason="InvalidSpec", message=str(error))
        return None


def _children(body: kopf.Body, job: TrainingJob) -> Iterator[dict[str, Any]]:
    for manifest in manifests(render(job, job.spec.policy.source)):
        manifest["metadata"].setdefault("namespace", where(body)[0])
        kopf.adopt(manifest, owner=body, strict=False)
        yield manifest


def _suspended(body: kopf.Body) -> bool:
    return bool((body.get("spec") or {}).get("suspend"))


def _indexed(jobs: kopf.Index[tuple[str, str], kopf.Body]) -> list[tuple[str, str | None]]:
    """(namespace, phase) of each TrainingJob in kopf's `jobs` index, read from a scrape's thread while
    kopf may change the index: each of its dicts is copied in one step (`list()` of a dict lets no
    other thread in), and a job gone meanwhile is skipped."""
    return [
        (namespace, (body.get("status") or {}).get("phase"))
        for namespace, name in list(jobs)
        for body in list(jobs.get((namespace, name), ()))
    ]


def register(
    registry: kopf.OperatorRegistry,
    cluster: Cluster,
    status_interval: float = STATUS_INTERVAL_SECONDS,
    summary_interval: float = SUMMARY_SECONDS,
    namespaces: Sequence[str] = (),
) -> None:
    """Put every handler on `registry`, acting on the cluster through `cluster`, counting in its metrics,
    for the jobs in `namespaces` (none: every namespace); what it does for each job is logged in a
    line per job at most every `summary_interval` seconds (operator/log_summary.py)."""
    scopes: list[str | None] = list(namespaces) or [None]
    store = PodStore(scopes)
    job_index: list[kopf.Index[tuple[str, str], kopf.Body]] = []
    """kopf's `jobs` index, once kopf hands it over (at startup)."""
    activity = JobActivity(summary_interval)
    actions = PodActions(cluster, store, activity)
    metrics = cluster.metrics
    metrics.read_pods_from(store.placed)

    @kopf.on.startup(registry=registry)
    def configure(*, settings: kopf.OperatorSettings, **kwargs: Any) -> None:
        jobs: kopf.Index[tuple[str, str], kopf.Body] = kwargs["jobs"]  # (kopf hands startup its indexes)
        job_index.append(jobs)
        metrics.read_jobs_from(lambda: _indexed(jobs))
        # Only our own events (remediations, invalid specs) and kopf's warnings and errors become
        # Kubernetes events: kopf's INFO logs would post one per timer run, every few seconds.
        settings.posting.level = logging.WARNING
        # kopf's listings (of the nodes, of the jobs) a page at a time, as they come: in one piece,
        # 25,000 pods (about 100 MB of JSON) had taken a restarted operator to 790 MiB; paged, 220 MiB.
        settings.watching.chunk_size = LIST_PAGE_SIZE
        # No diff base for the pods' and nodes' events, which no change handler reads (operator/diffbase.py).
        settings.persistence.diffbase_storage = JobsOnlyDiffBase(settings.persistence.diffbase_storage)

    @kopf.index(GROUP, VERSION, PLURAL, id="jobs", registry=registry)
    def jobs(*, body: kopf.Body, **_: Any) -> dict[tuple[str, str], kopf.Body]:
        return {where(body): body}

    def job_pods(body: kopf.Body) -> list[dict[str, Any]]:
        """The job's pods, as summaries from the store: the pod informers start with the first job
        handler (kopf's `jobs` index is filled by then), whose read waits for their first listing."""
        pod_informers.start()
        try:
            return store.pods(*where(body), timeout=FIRST_LISTING_WAIT_SECONDS)
        except NotListedYet as error:
            raise kopf.TemporaryError(str(error), delay=1) from None

    @kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, field="spec", registry=registry)
    @metrics.timed("reconcile")
    def reconcile(*, body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        job = _validated(body, patch)
        if job is None:
            return
        phase = (body.get("status") or {}).get("phase")
        patch.status["observedGeneration"] = body.metadata.get("generation")
        patch.status["slicesTotal"] = job.spec.slices
        if phase in (None, "Invalid"):
            patch.status["conditions"] = [condition("Invalid", "False", "Valid", "the spec is valid")]
        if job.spec.suspend:
            _create_missing(body, job, kinds=("Secret", "Service", "ConfigMap", "NetworkPolicy"), pods=[])
            _suspend(body, patch, job_pods(body))
            return
        kinds = ("Secret", "Service", "ConfigMap", "NetworkPolicy", "Pod")
        created = _create_missing(body, job, kinds=kinds, pods=job_pods(body))
        activity.note(where(body), "children created", created)
        if phase in (None, "Invalid", "Suspended"):
            patch.status["phase"] = "Pending"
        if phase == "Suspended":
            conditions = patch.status.get("conditions") or (body.get("status") or {}).get("conditions") or []
            resumed = condition("Suspended", "False", "Resumed", "spec.suspend is false")
            patch.status["conditions"] = with_condition(list(conditions), resumed)
            _post(body, reason="Resumed", message=f"resumed: {created} pods created")
        elif created:
            _post(
                body,
                reason="Created",
                message=f"created {created} children (pods, Service, ConfigMap, NetworkPolicy, Secret)",
            )

    @kopf.timer(GROUP, VERSION, PLURAL, interval=status_interval, registry=registry)
    @metrics.timed("timer")
    def keep(*, body: kopf.Body, patch: kopf.Patch, status: kopf.Status, **_: Any) -> None:
        line = activity.summary(where(body))
        if line is not None:
            logger.info(line)
        namespace, name = where(body)
        if status.get("phase") in OVER:
            # Level-based, once the phase is written: deleted in the look that found the job over,
            # a pod's DELETED event could reach the pod informers before the phase, and be replaced.
            for never in never_ran(job_pods(body)):
                cluster.delete_pod(namespace, never)
            return
        if status.get("phase") in (*FINAL_PHASES, None):
            return
        job = job_of_body(body)
        pods = job_pods(body)
        if job.spec.suspend:
            for pod in pods:  # a deletion that failed in the update handler
                cluster.delete_pod(namespace, pod["metadata"]["name"])
            return
        slice_signals = actions.slice_signals(pods)
        # Level-based too: a node that went NotReady before its pods were known.
        unready = [
            pod
            for pod in pods
            if not store.node_ready(pod["spec"]["nodeName"])
            and not actions.replacing.begun(
                (namespace, name), pod["metadata"]["name"], pod["metadata"]["uid"]
            )
        ]
        if unready:
            plans = {p["metadata"]["name"]: plan_for(p, NODE_NOT_READY) for p in unready}
            actions.replace((namespace, name), status, plans)
            activity.note((namespace, name), "pods deleted (node not ready)", len(unready))
        for pod in pods:
            seen, signal = slice_signals.get(slice_of(pod), (False, None))
            if seen and pod not in unready:  # (a pod that reached an announcing node after the node's event)
                actions.give_notice(pod, signal)
        if len(pods) < job.total_hosts:
            created = _create_missing(body, job, kinds=("Pod",), pods=pods)
            activity.note((namespace, name), "pods created", created)
        settled = actions.replacing.settled((namespace, name), pods, status)
        if settled:
            patch.status["replacing"] = settled
        # One snapshot for both what changed and which events say so: kopf updates a timer's
        # `status` in place as watch events arrive, so a status read twice could differ between
        # the reads (a change written with the event that tells of it derived from an older one).
        previous = dict(body.get("status") or {})
        derived = derive(job, pods, previous)
        for key, value in derived.status.items():
            if previous.get(key) != value:  # at rest nothing changes, and nothing is written
                patch.status[key] = value
        for event in derived.events:  # posted before kopf patches the status that says it happened
            cluster.post_event(body, warning=event.warning, reason=event.reason, message=event.message)
            if event.reason in SCALE_EVENTS:
                metrics.scale_events.labels(namespace=namespace, kind=SCALE_EVENTS[event.reason]).inc()

    @metrics.timed("pod_event")
    def pod_event(event_type: str | None, pod: dict[str, Any]) -> Callable[[], None] | None:
        """What one of a job's pods asks of the operator as an event (None: a listing) shows it: the
        pod informers' question (operator/pod_informers.py), answered in memory; they run the answer."""
        metadata = pod["metadata"]
        owner = _owner(str(metadata["namespace"]), str(metadata["labels"][LABEL_JOB]))
        if owner is None:
            return None  # the job is gone: its pods go with it
        activity.note(where(owner), "pod events")
        if not _live(owner):
            return None  # going, over, or suspended (its pods were deleted on purpose)
        if event_type == "DELETED":
            return partial(actions.recreate, owner, pod)
        return actions.action(owner, pod)

    pod_informers = PodInformers(cluster, store, scopes, pod_event)

    @kopf.on.cleanup(registry=registry)
    def stop_watching_pods(**_: Any) -> None:
        pod_informers.stop()

    def _owner(namespace: str, name: str) -> kopf.Body | None:
        """The job of that name, from kopf's index (read from an informer's thread: copied first)."""
        if not job_index:
            return None
        return next(iter(list(job_index[0].get((namespace, name), ()))), None)

    def _live(owner: kopf.Body) -> bool:
        """The job's pods are looked after: it is neither going, nor over, nor suspended."""
        if owner.metadata.get("deletionTimestamp"):
            return False
        return (owner.get("status") or {}).get("phase") not in FINAL_PHASES and not _suspended(owner)

    @kopf.on.event("", "v1", "nodes", registry=registry)
    @metrics.timed("node_event")
    async def node_event(*, type: str | None, body: kopf.Body, **kwargs: Any) -> None:
        node = str(body.metadata.name)
        if store.observe_node(body):  # (a node deleted while NotReady too)
            by_job: dict[JobKey, dict[str, Plan]] = {}
            for pod in store.summaries_on(node):
                if actions.replacing.begun(job_of(pod), pod["metadata"]["name"], pod["metadata"]["uid"]):
                    continue
                by_job.setdefault(job_of(pod), {})[pod["metadata"]["name"]] = plan_for(pod, NODE_NOT_READY)
            jobs: kopf.Index[tuple[str, str], kopf.Body] = kwargs["jobs"]
            for job_key, plans in by_job.items():  # each pod's DELETED event re-creates it
                owner = next(iter(jobs.get(job_key, [])), None)
                status = (owner.get("status") or {}) if owner is not None else {}
                await asyncio.to_thread(actions.replace, job_key, status, plans)
            return
        if type == "DELETED":
            store.forget_node(node)
            return
        signal = node_signal(body)
        previous = store.observe_signal(node, signal)
        if signal == previous:
            return  # (a node first seen announcing nothing: the jobs' timers take off stale notices)
        pods = store.summaries_on(node)
        logger.info("node %s %s: %d job pods on it", node, announcement(signal, previous), len(pods))
        if signal is not None:  # (a withdrawal stays the node's own: another node may announce)
            pods = actions.with_slice_mates(pods)
        for pod in pods:
            await asyncio.to_thread(actions.give_notice, pod, signal)

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)
    @metrics.timed("delete")
    def cleanup(*, body: kopf.Body, **_: Any) -> None:
        cluster.delete_children(*where(body))
        store.forget_job(*where(body))
        actions.replacing.forget_job(where(body))
        line = activity.forget(where(body))
        if line is not None:
            logger.info(line)

    def _create_missing(
        body: kopf.Body, job: TrainingJob, kinds: tuple[str, ...], pods: list[dict[str, Any]]
    ) -> int:
        """Create the children of `kinds` that do not exist: one create per pod missing from `pods`
        (a restarted operator re-creates only what went missing; a 409 means it was there)."""
        existing = {p["metadata"]["name"] for p in pods}
        plans = actions.replacing.plans(where(body), body.get("status") or {})
        wanted = (
            m
            for m in _children(body, job)
            if m["kind"] in kinds and not (m["kind"] == "Pod" and m["metadata"]["name"] in existing)
        )
        created = _create_credentials(body, job) if "Secret" in kinds else 0
        # A pod missing in the middle of its hot-swap (its operator stopped between the delete and
        # the create) is created as its plan says (operator/replacements.py). The rest are handed to
        # the creates as they are rendered: a list of 25,000 manifests held 250 MB at once.

        def fresh() -> Iterator[dict[str, Any]]:
            for manifest in wanted:
                plan = plans.get(manifest["metadata"]["name"]) if manifest["kind"] == "Pod" else None
                if plan is None:
                    yield manifest
                else:  # (said in its own HotSwap event, not counted here)
                    actions.create_replacement(
                        body, job, manifest["metadata"]["name"], host_of(manifest), plan
                    )

        return created + cluster.create_all(fresh())

    def _create_credentials(body: kopf.Body, job: TrainingJob) -> int:
        """The job's credentials Secret, made for it alone, unless it exists (409: kept as it is, the
        pods hold its certificate). Owned by the job: the garbage collector deletes it with the job,
        so the operator needs no right to delete, read or list any Secret."""
        secret = render(job, job.spec.policy.source).credentials_secret(
            credentials.generate(job.metadata.name)
        )
        secret["metadata"].setdefault("namespace", where(body)[0])
        kopf.adopt(secret, owner=body, strict=False)
        return int(cluster.create(secret))

    def _suspend(body: kopf.Body, patch: kopf.Patch, pods: list[dict[str, Any]]) -> None:
        """Delete the job's pods (their supervisors end; the persistent tier keeps the progress)."""
        namespace, _ = where(body)
        for pod in pods:
            cluster.delete_pod(namespace, pod["metadata"]["name"])
        previous = (body.get("status") or {}).get("phase")
        patch.status["phase"] = "Suspended"
        patch.status["slicesReady"] = 0
        conditions = patch.status.get("conditions") or (body.get("status") or {}).get("conditions") or []
        suspended = condition("Suspended", "True", "SpecSuspend", "spec.suspend is true: no pods run")
        patch.status["conditions"] = with_condition(list(conditions), suspended)
        if previous != "Suspended":
            _post(body, reason="Suspended", message=f"suspended: {len(pods)} pods deleted")
