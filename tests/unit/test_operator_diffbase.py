"""kopf's diff base for TrainingJobs only (operator/diffbase.py): a pod's or node's event costs no
essence (kopf's own storage deep-copies one for every event, the negative control), and a
TrainingJob's essence is kopf's, stored and read back as before."""

from __future__ import annotations

import kopf
from slicekeeper.operator.diffbase import JobsOnlyDiffBase

POD = kopf.Body(
    {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "tiny-lm-s0-w0", "namespace": "research", "labels": {"a": "b"}},
        "spec": {"containers": [{"name": "supervisor", "image": "x"}]},
    }
)
JOB = {
    "apiVersion": "slicekeeper.dev/v1alpha1",
    "kind": "TrainingJob",
    "metadata": {"name": "tiny-lm", "namespace": "research", "annotations": {}},
    "spec": {"slices": 2},
}


def test_a_pod_event_builds_no_essence_where_kopfs_own_storage_copies_one():
    kopfs = kopf.AnnotationsDiffBaseStorage()
    assert kopfs.build(body=POD)  # the negative control: a deep copy for every pod event
    ours = JobsOnlyDiffBase(kopfs)
    assert ours.build(body=POD) is None and ours.fetch(body=POD) is None
    patch = kopf.Patch()
    ours.store(body=POD, patch=patch, essence=kopfs.build(body=POD))
    assert not patch


def test_a_training_jobs_essence_is_kopfs_stored_and_read_back():
    kopfs = kopf.AnnotationsDiffBaseStorage()
    ours = JobsOnlyDiffBase(kopfs)
    essence = ours.build(body=kopf.Body(JOB))
    assert essence == kopfs.build(body=kopf.Body(JOB)) and essence["spec"] == {"slices": 2}
    patch = kopf.Patch()
    ours.store(body=kopf.Body(JOB), patch=patch, essence=essence)
    stored = {**JOB, "metadata": {**JOB["metadata"], "annotations": dict(patch["metadata"]["annotations"])}}
    assert ours.fetch(body=kopf.Body(stored)) == essence
