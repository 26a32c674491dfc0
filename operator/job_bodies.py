"""A TrainingJob as kopf hands it over (a `kopf.Body`): where it is, and its model."""

from __future__ import annotations

import kopf

from slicekeeper.api import TrainingJob, parse_training_job


def where(body: kopf.Body) -> tuple[str, str]:
    """(namespace, name) of a namespaced object: TrainingJobs and pods always have both."""
    namespace, name = body.metadata.namespace, body.metadata.name
    if namespace is None or name is None:
        raise kopf.PermanentError(f"expected a namespaced object, got {namespace}/{name}")
    return str(namespace), str(name)


def job_of_body(body: kopf.Body) -> TrainingJob:
    """The TrainingJob model of `body`; its status is ours (and kopf's), never the user's input."""
    document = {key: value for key, value in body.items() if key != "status"}
    namespace, name = where(body)
    return parse_training_job(document, f"TrainingJob {namespace}/{name}")
