"""The leader's view of its job, as the `slicekeeper.dev/status` annotation on the leader's pod carries it.

The leading supervisor builds it (supervisor/leader/status.py) and writes it on its own pod
(supervisor/pod/own_pod.py); the operator reads it from the pods and merges it into the TrainingJob's
status (operator/job_status.py). The two never share a process, only this annotation: both ends use
this one definition, so neither indexes the other's JSON by a key it guessed.

A TypedDict (validated by pydantic at the reader's edge), not a model: the view is JSON merged key by
key into the TrainingJob's status, under the status's own camelCase names. Every key is optional to
the reader: a leader of an older release may publish fewer, and the operator takes what is there.
"""

from __future__ import annotations

import json

from pydantic import TypeAdapter
from typing_extensions import TypedDict  # pydantic validates a TypedDict from here on Python < 3.12


class LastRestore(TypedDict, total=False):
    """The job's most recent start from a checkpoint (slicekeeper.api.LastRestore in the status)."""

    generation: int
    cause: str
    """A fault kind, or `resume`: a start from an earlier run's persistent checkpoint."""
    step: int | None
    """The step restored; None: from scratch."""
    stepsReplayed: int


class LeaderView(TypedDict, total=False):
    state: str
    """The job's state in its leader's memory (`running`, `stopping`, `succeeded`, `failed`)."""
    generation: int
    step: int
    """The furthest step the job completed."""
    slicesActive: int
    """Slices taking part: fewer than asked for after a scale-down."""
    restarts: dict[str, int]
    """In-job restarts by the kind of fault that caused them."""
    hotSwaps: int
    lastCheckpointStep: int | None
    """The newest step every host's shard can be restored from."""
    lastRestore: LastRestore | None
    awaitingReplacement: list[int]
    """Hosts lost whose replacement pod the leader waits for."""
    failureReason: str | None
    term: int
    """The publishing leader's term: the view of the newest term counts (a replaced leader's is stale)."""
    paramsFingerprint: str | None
    """Once the job succeeded: the digest of the final parameters every host agreed on."""
    goodput: float
    """The leading host's goodput so far."""


_VIEW: TypeAdapter[LeaderView] = TypeAdapter(LeaderView)


def encode(view: LeaderView) -> str:
    """The annotation's value."""
    return json.dumps(view, sort_keys=True)


def decode(text: str) -> LeaderView:
    """The view an annotation's value holds; ValueError (naming the key that is wrong) for one that
    is no view. Keys it does not know are dropped."""
    return _VIEW.validate_json(text)
