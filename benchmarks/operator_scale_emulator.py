"""The emulated API server of the operator scale benchmark (benchmarks/operator_scale.py): the test suite's
emulator with running counts, and the reading of its request log (which requests are the operator's,
which are writes, when it last wrote).

Its own module: every phase of a run measures through it, and it is kept cheap (a running count of
pods; the log read only over a phase's window) since it shares the event loop with the emulator.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kmock import resource
from kmock._internal import enums, rendering

from benchmarks.operator_scale_job import NAMESPACE
from tests.support.cluster_emulator import TRAININGJOBS, ClusterEmulator

USER_AGENT = "slicekeeper-operator-scale-benchmark"
"""Our own requests (the apply, the scheduler's and the kubelet's patches) carry this, and are left out."""
WRITES = (enums.action.CREATE, enums.action.UPDATE, enums.action.DELETE)
PODS = resource("v1/pods")
EVENTS = resource("v1/events")
JOBS = resource(TRAININGJOBS)


class BenchEmulator(ClusterEmulator):
    """The tests' emulator, counting the pods that exist and timing every request as it arrives."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.live_pods = 0
        self.arrivals: dict[int, float] = {}

    async def _handle(self, request: rendering.Request) -> Any:
        self.arrivals[request.id] = time.monotonic()
        response = await super()._handle(request)  # raises on 404 / 409: nothing changed
        if getattr(response, "status", 200) >= 300:  # a 429 of the emulator's throttle
            return response
        if request.resource == PODS and request.namespace == NAMESPACE:
            if request.action == enums.action.CREATE:
                self.live_pods += 1
            elif request.action == enums.action.DELETE:
                self.live_pods -= 1
        return response

    def pod(self, name: str) -> dict[str, Any] | None:
        key = (PODS, NAMESPACE, name)
        return dict(self.objects[key].raw) if key in self.objects and not self.objects[key].deleted else None

    def job(self, name: str) -> dict[str, Any]:
        return dict(self.objects[(JOBS, NAMESPACE, name)].raw)

    def job_exists(self, name: str) -> bool:
        key = (JOBS, NAMESPACE, name)
        return key in self.objects and not self.objects[key].deleted


@dataclass
class Tally:
    """The operator's API requests in a window [start, end) of the emulator's request log (end 0: to now)."""

    emulator: BenchEmulator
    start: int
    end: int = 0

    def requests(self) -> list[rendering.Request]:
        return [
            r
            for r in self.emulator._requests[self.start : self.end or None]
            if r.headers.get("User-Agent") != USER_AGENT
        ]

    def writes(self) -> list[rendering.Request]:
        return [r for r in self.requests() if r.action in WRITES]


def describe(request: rendering.Request) -> str:
    """'pods CREATE', 'trainingjobs/status UPDATE', 'GET /apis' (discovery), ..."""
    if request.resource is None or request.resource.plural is None or request.action is None:
        return f"{request.method.value} {request.url.path}"
    what = request.resource.plural
    if request.subresource:
        what = f"{what}/{request.subresource}"
    return f"{what} {request.action.name}"


def last_write_age(
    emulator: BenchEmulator, since: int, since_time: float, ignore: Callable[[rendering.Request], bool]
) -> float:
    """Seconds since the operator's last write after request `since` (made at `since_time` or later)
    that `ignore` does not exclude; since `since_time` if there was none."""
    requests = emulator._requests
    last = since_time
    for index in range(len(requests) - 1, since - 1, -1):
        request = requests[index]
        ours = request.headers.get("User-Agent") == USER_AGENT
        if request.action in WRITES and not ours and not ignore(request):
            last = max(last, emulator.arrivals.get(index, since_time))
            break
    return time.monotonic() - last


def is_job_status_patch(request: rendering.Request) -> bool:
    return request.resource == JOBS and request.action == enums.action.UPDATE


def breakdown(requests: list[rendering.Request]) -> dict[str, int]:
    return dict(sorted(Counter(describe(r) for r in requests).items()))
