"""The rules every slicekeeper process keeps toward the Kubernetes API server: the operator's and each
pod's supervisor's (its pod's annotations, the job's Lease).

- A client-side rate limit, a token bucket of `qps` tokens a second, `burst` deep. Kubernetes
  controllers limit their own request rate (client-go's flowcontrol token bucket: 5 QPS and a burst
  of 10 by default, kube-controller-manager 20/30), so that one controller creating 25,000 pods does
  not starve the API server's other clients; API Priority and Fairness then shares the server
  between them. A client takes a token before each request, every thread sharing the one bucket; a
  request that finds none waits for the next. `qps` 0 means no limit.
- Answers 429 and 5xx retried with exponential backoff and jitter (`retry_rules`), a `Retry-After`
  the API server sends waited for: urllib3's retry policy, which the official client's HTTP layer
  applies to each request (`Configuration.retries`).

The operator's limits are its flags (`--api-qps`, `--api-burst`); a supervisor's are client-go's
defaults (`SUPERVISOR_QPS`, `SUPERVISOR_BURST`): a job's thousands of supervisors each make a few
requests a minute at most, their leader a few a second.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

RETRIED_STATUSES = (429, 500, 502, 503, 504)

DEFAULT_QPS = 1000.0
"""Requests a second: a 25,000-host job's pods in about 30 s. Google's 130,000-node experiment
sustained 1,000 pods a second, its 65,000-node benchmark created about 420; kube-controller-manager's
default is 20, for a controller among many on any cluster. The operator's requests grow with its
jobs, and a job of this size runs only on a cluster whose API server is sized for it; API Priority
and Fairness (the chart's FlowSchema) keeps its share there, and a 429 it answers is waited out."""
DEFAULT_BURST = 400
"""Requests taken at once after a quiet spell."""
SUPERVISOR_QPS = 5.0
"""A supervisor's requests a second (client-go's default)."""
SUPERVISOR_BURST = 10


@dataclass
class TokenBucket:
    qps: float
    burst: int
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    _tokens: float = field(init=False)
    _at: float = field(init=False)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.qps < 0 or self.burst < 1:
            raise ValueError(f"a rate limit needs qps >= 0 and burst >= 1 (got {self.qps}, {self.burst})")
        self._tokens = float(self.burst)
        self._at = self.clock()

    def take(self) -> float:
        """Take a token, waiting for one if the bucket is empty; the seconds waited."""
        wait = self.reserve()
        if wait > 0:
            self.sleep(wait)
        return wait

    def reserve(self) -> float:
        """Take a token that may not be there yet; the seconds to wait before using it (an event
        loop's coroutine waits them itself)."""
        if self.qps == 0:
            return 0.0
        with self._lock:  # reserve under the lock, wait outside it: waiters queue in order
            now = self.clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
            self._at = now
            self._tokens -= 1.0
            return -self._tokens / self.qps if self._tokens < 0 else 0.0


def retry_rules(*, total: int = 6, backoff_max: float = 10.0) -> dict[str, Any]:
    """urllib3.Retry's arguments for the rules above: `total` attempts more at most, waits of 0.2,
    0.4, 0.8, ... seconds (at most `backoff_max`) plus up to 0.2 s at random, or what Retry-After says."""
    return {
        "total": total,
        "backoff_factor": 0.2,
        "status_forcelist": RETRIED_STATUSES,
        "allowed_methods": None,  # POST and PATCH too: every write slicekeeper makes is idempotent
        "respect_retry_after_header": True,
        "backoff_jitter": 0.2,  # many clients refused at once spread out
        "backoff_max": backoff_max,
        "raise_on_status": False,
    }


def limited_client(
    configuration: Any, limiter: TokenBucket, *, total: int = 6, backoff_max: float = 10.0
) -> Any:
    """The official client's ApiClient for `configuration`, keeping the rules: its requests take a
    token of `limiter` first and are retried as `retry_rules` says."""
    import kubernetes  # the `operator` extra: only the operator and pods need it
    import urllib3
    from kubernetes.client.rest import RESTClientObject

    class LimitedRestClient(RESTClientObject):  # type: ignore[misc]
        def request(self, *args: Any, **kwargs: Any) -> Any:
            limiter.take()
            return super().request(*args, **kwargs)

    configuration.retries = urllib3.Retry(**retry_rules(total=total, backoff_max=backoff_max))
    client = kubernetes.client.ApiClient(configuration)
    client.rest_client = LimitedRestClient(configuration)
    return client
