"""The operator's client-side request rate limit: a token bucket of `qps` tokens a second, `burst` deep.

Kubernetes controllers limit their own request rate (client-go's flowcontrol token bucket: 5 QPS and a
burst of 10 by default, kube-controller-manager 20/30), so that one controller creating 25,000 pods
does not starve the API server's other clients; API Priority and Fairness then shares the server
between them. The operator's client takes a token before each request (`Cluster`), every thread
sharing the one bucket; a request that finds none waits for the next. `qps` 0 means no limit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_QPS = 200.0
"""Requests a second: a large cluster's operator creating a job's pods (GKE's 65,000-node benchmark
created about 420 pods a second; kube-controller-manager's default is 20)."""
DEFAULT_BURST = 400
"""Requests taken at once after a quiet spell."""


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
        if self.qps == 0:
            return 0.0
        with self._lock:  # reserve under the lock, wait outside it: waiters queue in order
            now = self.clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
            self._at = now
            self._tokens -= 1.0
            wait = -self._tokens / self.qps if self._tokens < 0 else 0.0
        if wait > 0:
            self.sleep(wait)
        return wait
