"""A supervisor's watch on its own pod for the operator's notice that the machine will go.

The operator reads the cluster's signals of a node's coming loss (GKE's maintenance label, a
termination taint: docs/operations.md) and writes them on the pods of that node as the annotation
`slicekeeper.dev/notice` (protocol.ANNOTATION_NOTICE). Each host's supervisor watches its own pod
(one watch per pod, field-selected by its name, as a kubelet watches its node's pods: the API server
serves it from its watch cache) and passes a new notice on to the job's leader
(supervisor.host.notices.announce). The watch runs in a thread (the kubernetes client blocks) and is
opened again after an error or its server-side timeout, after a pause.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from slicekeeper.supervisor.pod.own_pod import OwnPod

from slicekeeper import protocol

WATCH_SECONDS = 300
"""One watch request lasts this long on the server before it is opened again."""
RETRY_SECONDS = 5.0
"""After an error (the API server unreachable, the watch refused), the next attempt waits this long."""


class WatchEnded(Exception):
    """The API server ended the watch with an error event: it is opened again."""


class PodNotice(BaseModel):
    """The operator's notice on a pod (protocol.ANNOTATION_NOTICE)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    kind: Literal["maintenance", "preemption"]
    at: float
    source: str = ""


def parse_notice(text: str) -> PodNotice:
    """The notice an annotation's value holds; ValueError naming the annotation and what is wrong."""
    where = f"annotation {protocol.ANNOTATION_NOTICE}"
    try:
        return PodNotice.model_validate(json.loads(text))
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in error.errors())
        raise ValueError(f"{where}: not a notice ({problems})") from None
    except ValueError as error:
        raise ValueError(f"{where}: not a notice (not JSON: {error})") from None


def _annotation_values(pod: OwnPod, stop: threading.Event) -> Iterator[str | None]:
    """The notice annotation's value each time the pod changes (blocking), until `stop`."""
    from kubernetes import watch  # the `operator` extra: only pods need it

    stream = watch.Watch()
    for event in stream.stream(
        pod._core().list_namespaced_pod,
        pod.namespace,
        field_selector=f"metadata.name={pod.name}",
        timeout_seconds=WATCH_SECONDS,
    ):
        if stop.is_set():
            stream.stop()
            return
        kind, obj = event.get("type"), event.get("object")
        if kind == "ERROR":  # e.g. 410 Gone, the watch too old: open it again
            raise WatchEnded(f"the watch ended: {obj}"[:200])
        if kind not in ("ADDED", "MODIFIED") or getattr(obj, "metadata", None) is None:
            continue  # a bookmark, the pod's deletion, or what the client could not make a pod of
        if obj.metadata.name != pod.name:
            continue
        yield (obj.metadata.annotations or {}).get(protocol.ANNOTATION_NOTICE)


async def watch_notices(
    pod: OwnPod, on_notice: Callable[[PodNotice], Awaitable[None]], say: Callable[[str], None]
) -> None:
    """Call `on_notice` with each new notice written on `pod`, until cancelled; a malformed one is said
    and skipped, a failed watch opened again after RETRY_SECONDS."""
    loop = asyncio.get_running_loop()
    values: asyncio.Queue[str | None] = asyncio.Queue()
    stop = threading.Event()

    def follow() -> None:
        while not stop.is_set():
            try:
                for value in _annotation_values(pod, stop):
                    loop.call_soon_threadsafe(values.put_nowait, value)
            except Exception as error:  # the API server unreachable, the watch refused: again, later
                loop.call_soon_threadsafe(
                    say, f"watching pod {pod.namespace}/{pod.name} failed: {error!r}"[:300]
                )
                stop.wait(RETRY_SECONDS)

    thread = threading.Thread(target=follow, name="pod-notices", daemon=True)
    thread.start()
    seen: str | None = None
    try:
        while True:
            value = await values.get()
            if value is None or value == seen:
                continue
            seen = value
            try:
                notice = parse_notice(value)
            except ValueError as error:
                say(str(error))
                continue
            await on_notice(notice)
    finally:
        stop.set()


def seconds_left(notice: PodNotice) -> float:
    """How long until the machine goes (0 for a notice whose time passed)."""
    return max(0.0, notice.at - time.time())
