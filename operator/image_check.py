"""Telling a training image that cannot run slicekeeper from a host that failed.

Every TPU pod runs `python -m slicekeeper.supervisor --in-pod -- <the user's command>` in the job's
own image (`spec.workload.image`), so that image must carry Python and the slicekeeper package
(docs/install.md, "The training image"). The operator cannot know that before a pod starts: an image
is opaque to it, and pulling one to look inside is the kubelet's job, not the API server's. When a pod
ends, though, its container status says why: with `terminationMessagePolicy: FallbackToLogsOnError`
the message of a container that exited in error is its last log lines, which name the missing module,
and a container whose command could not be started at all says so in its reason and message.

Replacing such a pod would only start the same image again (every host runs it), so the job fails
at once with a message naming the image and what it lacks, instead of hot-swapping forever.
"""

from __future__ import annotations

import re
from typing import Any

from slicekeeper.operator.hot_swap import terminated_state

INSTALL_HINT = (
    "install slicekeeper in it: pip install 'slicekeeper[jax]' (docs/install.md, The training image)"
)

_MISSING_MODULE = re.compile(r"No module named '?slicekeeper(\.supervisor)?'?(?![\w.])")
"""Python's words for `python -m slicekeeper.supervisor` without the package (3.11: `No module named
slicekeeper.supervisor`; others quote `'slicekeeper'`); never a module of the user's that merely
starts with the name."""
_NOT_STARTED = re.compile(r'executable file not found|exec: "?python"?', re.IGNORECASE)
_NOT_STARTED_REASONS = ("StartError", "ContainerCannotRun", "CreateContainerError")


def unusable_image(pod: dict[str, Any]) -> str | None:
    """Why the pod's image cannot run slicekeeper's supervisor (a message for the job's Failed
    condition, naming the image), or None when its end says nothing of the kind."""
    terminated = terminated_state(pod)
    if not terminated or terminated.get("exitCode") == 0:
        return None
    message = str(terminated.get("message") or "")
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    image = containers[0].get("image", "?")
    if _MISSING_MODULE.search(message):
        return f"the image {image} does not carry slicekeeper (No module named slicekeeper): {INSTALL_HINT}"
    if terminated.get("reason") in _NOT_STARTED_REASONS and _NOT_STARTED.search(message):
        return (
            f"the image {image} cannot start slicekeeper's supervisor, no `python` on its PATH "
            f"({terminated['reason']}: {message.strip()[:200]}): {INSTALL_HINT}"
        )
    return None
