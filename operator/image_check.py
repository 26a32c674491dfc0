"""Telling a training image that cannot run slicekeeper from a host that failed.

Every TPU pod runs `python -m slicekeeper.supervisor --in-pod -- <the user's command>` in the job's
own image (`spec.workload.image`), so that image must carry Python and the slicekeeper package
(docs/install.md, "The training image"). The operator cannot know that before a pod starts: an image
is opaque to it, and pulling one to look inside is the kubelet's job, not the API server's. Once a
pod's container ends or cannot start, though, its status says why: with `terminationMessagePolicy:
FallbackToLogsOnError` the message of a container that exited in error is its last log lines, which
hold the interpreter's line naming the missing module (the workload's own output goes to its log
file, not the container's), and a container whose command could not be started says so in its reason
and message.

A missing module exits 1, which already failed the job (a supervisor's "the job failed"), but with
Python's bare words; here the message names the image and the fix. An image without `python` is
worse: the pod failed (or, with CRI-O, waits) without a supervisor's word and was replaced by another
pod of the same image, forever. Both now fail the job at once.
"""

from __future__ import annotations

import re
from typing import Any

from slicekeeper.operator.hot_swap import terminated_state

INSTALL_HINT = (
    "install slicekeeper in it: pip install slicekeeper, Python 3.11 or later "
    "(docs/install.md, The training image)"
)

_MISSING_MODULE = re.compile(
    r"^\S*python[\d.]*: (Error while finding module specification for 'slicekeeper\.supervisor'"
    r"|No module named slicekeeper\.supervisor)",
    re.MULTILINE,
)
"""The interpreter's own line for `python -m slicekeeper.supervisor` without the package (`Error while
finding module specification ... No module named 'slicekeeper'`; or `No module named
slicekeeper.supervisor` when some other `slicekeeper` folder is importable), at the start of a line:
never the supervisor's own log lines, which may quote what the workload said."""
_NO_EXECUTABLE = re.compile(r"executable file.*not found", re.IGNORECASE)
"""The container runtime could not start the command (containerd: `exec: "python": executable file not
found in $PATH`; CRI-O: ``executable file `python` not found``)."""
_NOT_STARTED_REASONS = ("StartError", "ContainerCannotRun", "CreateContainerError", "RunContainerError")
"""Terminated reasons (containerd's StartError, Docker's ContainerCannotRun) and waiting ones (CRI-O's
CreateContainerError) of a container whose command did not start."""


def _container_state(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The container's terminated state if it ended, else its waiting state if it waits."""
    ended = terminated_state(pod)
    if ended:
        return ended
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            return dict(waiting)
    return None


def unusable_image(pod: dict[str, Any]) -> str | None:
    """Why the pod's image cannot run slicekeeper's supervisor (a message for the job's Failed
    condition, naming the image), or None when its state says nothing of the kind."""
    state = _container_state(pod)
    if not state or state.get("exitCode") == 0:
        return None
    message = str(state.get("message") or "")
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    image = containers[0].get("image", "?")
    if _MISSING_MODULE.search(message):
        return f"the image {image} does not carry slicekeeper (No module named slicekeeper): {INSTALL_HINT}"
    if state.get("reason") in _NOT_STARTED_REASONS and "python" in message and _NO_EXECUTABLE.search(message):
        return (
            f"the image {image} cannot start slicekeeper's supervisor, no `python` on its PATH "
            f"({state['reason']}: {message.strip()[:200]}): {INSTALL_HINT}"
        )
    return None
