"""Straggler detection: which host makes the whole job slow, from each host's own work per step.

What is measured. In a synchronous data-parallel job every step ends with a collective that waits for
the slowest host, so every host's step *duration* is the same: the slow host's. Step duration can
tell that the job is slow, never which host is. What differs is each host's own *work*: the seconds
from the step's begin to the moment its own computation is done and it starts waiting for the others
(the SDK's `work_done()`, reported as `work` on step end). A slow host's work grows F-fold; the hosts
that wait for it in the collective do their own work at normal speed and spend the rest of the step
waiting, which `work` leaves out. A score on `work` therefore singles out the slow host and never
its waiting peers.

The score. Per host, the median of its own work over its last `window` scored steps (a median, so
that one noisy step, a page fault, a 3x scheduling spike, moves nothing). The reference for a host is
the median of the *other* hosts' medians: a slow host never drags its own reference up, which matters
for small jobs (with two hosts, a median over both would halve a 2x slowdown into 1.33x). score =
own median / reference, so 1.0 is normal and 2.0 is twice as slow (NVRx reports the inverse,
reference / own, where low is bad). A host is over the line when its score is >= `threshold` and its
median exceeds the reference by at least `min_excess_seconds` (a 30% excess of a millisecond is
scheduling noise, not a sick host; 5 ms, half of what a 2x slowdown adds to the reference job's
10 ms of own work per step on CPU devices). It is a straggler when it stays over the line for `persistence`
consecutive scored steps: a sustained slowdown, never one noisy step. Each host is reported once per
`reset`; scores stay available for metrics and for the policy's context.

Hosts sharing a core. In local mode several host processes share the machine's few cores, each
host's own work on one of them (protocol.ENV_OWN_WORK_CORE, reported with every step as `core`). A
core is then part of the host: a virtual machine's vCPU can run slower than its sibling for minutes
(a busy hyperthread on the physical machine, which the guest's CPU time still counts), and every
host on it slows alike. Pinned two to a core, a fault-free run of four hosts once scored the two
hosts of a slowed core 1.56 and 1.51 against 0.66 and 0.65, and replaced one as a straggler. So a
host that reports its core is compared with the other hosts reporting the same core, when there are
any: a slow core moves the host and its reference together, and a host slow on its own still stands
out against its core-mates. A host alone on its core (or reporting none) is compared with every
other host, as on a real slice.

A straggler is a host that *became* slow. Each host's first full-window score after a reset is its
baseline, and a host is over the line only when its score is also `threshold` times its baseline. A
difference that was there from the start is how the hosts are (a slower machine type, or, on a test
machine, CPU shared unevenly: with two hosts on two cores, the host that finishes first and waits in
the collective takes CPU from the other, which then looks twice as slow for the whole run); a
slowdown that begins while the job trains is a sick host. The price: a host already slow when a
world starts is not found until the next reset gives the others a chance to compare again.

Feeding it. The leader receives (host, step, work) in any order; `observe` returns the findings of a
step as soon as the last host of the current world has reported it. Steps are scored in order; a
report for a step already scored (or older) is ignored, and a step some host never reported is dropped
when a later step completes. The first `warmup` steps of each host after a `reset` are not scored
(compilation, restore, caches warming). When any host reports no `work` (None: a workload that does
not call `work_done()`), that step cannot be scored: it is skipped, it neither extends nor breaks a
streak, and a workload that never reports `work` gets no scores and no findings.

The defaults (window 12, threshold 1.3, persistence 6) were chosen on simulated jobs of four hosts
with lognormal noise (sigma 0.15) and occasional 3x single-step spikes: no finding in hundreds of
healthy 1000-step runs, a 2x slowdown flagged about 10 steps after it begins, 1.5x within about 25.
A shorter window or persistence reacts sooner and raises false alarms; noisier hosts (sigma 0.2 and
more) want a longer window. The local JAX job, its own work timed in CPU seconds on each host's own
core, has sigma 0.12-0.17; timed on the wall clock with 4 hosts sharing 2 cores it had 0.6, and
false findings (docs/benchmarks.md, "How the signal was made to measure the host").
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

_MAX_PENDING_STEPS = 64
"""Steps waiting for their last report; older ones are dropped (a host that stopped reporting)."""


@dataclass(frozen=True)
class Finding:
    """A host found to be a persistent straggler."""

    host: int
    score: float
    """Own median work / the other hosts' median: 2.0 is twice as slow."""
    step: int
    """The step whose report completed the detection."""
    work_seconds: float
    """The host's median own work per step over the window."""
    reference_seconds: float
    """The other hosts' median own work per step (median of their medians; of the hosts sharing its
    core, when it shares one)."""


class StragglerDetector:
    def __init__(
        self,
        *,
        window: int = 12,
        threshold: float = 1.3,
        persistence: int = 6,
        warmup: int = 2,
        min_excess_seconds: float = 0.005,
    ) -> None:
        if window < 1 or persistence < 1 or warmup < 0:
            raise ValueError("window and persistence must be at least 1, warmup at least 0")
        if threshold <= 1.0 or min_excess_seconds < 0.0:
            raise ValueError("threshold must be greater than 1 and min_excess_seconds not negative")
        self.window = window
        self.threshold = threshold
        self.persistence = persistence
        self.warmup = warmup
        self.min_excess_seconds = min_excess_seconds
        self._hosts: frozenset[int] = frozenset()
        self._pending: dict[int, dict[int, float | None]] = {}
        self._last_evaluated: int | None = None
        self._steps_seen = 0
        self._works: dict[int, deque[float]] = {}
        self._cores: dict[int, int] = {}
        self._streaks: dict[int, int] = {}
        self._scores: dict[int, float] = {}
        self._baselines: dict[int, float] = {}
        self._flagged: set[int] = set()

    def reset(self, hosts: Iterable[int]) -> None:
        """A new generation or world: forget every window, streak and finding; warm up again.

        Call it whenever the hosts (re)start their workloads: steps replay after a restore, and the
        first steps of a start are not typical."""
        self._hosts = frozenset(hosts)
        self._pending = {}
        self._last_evaluated = None
        self._steps_seen = 0
        self._works = {host: deque(maxlen=self.window) for host in self._hosts}
        self._cores = {}
        self._streaks = {host: 0 for host in self._hosts}
        self._scores = {}
        self._baselines = {}
        self._flagged = set()

    def state(self) -> dict[str, Any]:
        """What the detector has seen since its last reset, as JSON: a leader taking over carries on
        with the same windows, streaks, baselines and findings (restore with `carry_on`)."""
        return {
            "hosts": sorted(self._hosts),
            "pending": {str(s): {str(h): w for h, w in r.items()} for s, r in self._pending.items()},
            "last_evaluated": self._last_evaluated,
            "steps_seen": self._steps_seen,
            "works": {str(h): list(w) for h, w in self._works.items()},
            "cores": {str(h): c for h, c in self._cores.items()},
            "streaks": {str(h): n for h, n in self._streaks.items()},
            "scores": {str(h): v for h, v in self._scores.items()},
            "baselines": {str(h): v for h, v in self._baselines.items()},
            "flagged": sorted(self._flagged),
        }

    def carry_on_flagged(self, hosts: Iterable[int], flagged: Iterable[int]) -> None:
        """Start afresh on `hosts`, with `flagged` found straggling already (not found again): what a
        leader taking over carries on when the windows were not written down."""
        self.reset(hosts)
        self._flagged = set(flagged) & self._hosts

    def carry_on(self, state: dict[str, Any]) -> None:
        """Continue from `state()` of another detector with the same settings."""
        self.reset(state["hosts"])
        self._pending = {int(s): {int(h): w for h, w in r.items()} for s, r in state["pending"].items()}
        self._last_evaluated = state["last_evaluated"]
        self._steps_seen = state["steps_seen"]
        self._works = {int(h): deque(w, maxlen=self.window) for h, w in state["works"].items()}
        self._cores = {int(h): c for h, c in state.get("cores", {}).items()}
        self._streaks = {int(h): n for h, n in state["streaks"].items()}
        self._scores = {int(h): v for h, v in state["scores"].items()}
        self._baselines = {int(h): v for h, v in state["baselines"].items()}
        self._flagged = set(state["flagged"])

    def observe(self, host: int, step: int, work: float | None, *, core: int | None = None) -> list[Finding]:
        """Record `host`'s own work in `step` (`core`: the core it ran on, in local mode); return the
        findings once every host reported the step.

        Reports from hosts outside the current world (a previous generation's) are ignored."""
        if host not in self._hosts or (self._last_evaluated is not None and step <= self._last_evaluated):
            return []
        if core is not None:
            self._cores[host] = core
        reports = self._pending.setdefault(step, {})
        reports[host] = work
        if len(reports) < len(self._hosts):
            if len(self._pending) > _MAX_PENDING_STEPS:
                del self._pending[min(self._pending)]
            return []
        for stale in [s for s in self._pending if s <= step]:
            del self._pending[stale]
        self._last_evaluated = step
        return self._evaluate(step, reports)

    def scores(self) -> dict[int, float]:
        """The latest score of every host scored since the last reset (1.0 is normal)."""
        return dict(self._scores)

    @property
    def flagged(self) -> frozenset[int]:
        """Hosts reported as stragglers since the last reset."""
        return frozenset(self._flagged)

    def _references(self, medians: dict[int, float]) -> dict[int, float]:
        """Each host's reference: the median of its peers' medians, the peers being the other hosts
        sharing its core when there are any, else every other host. One sort per core and one of all
        hosts, then each host's reference is read off them: a job of 25,000 hosts scores a step in
        milliseconds, where comparing each host with every other cost the square of its size."""
        everyone = sorted(medians.values())
        by_core: dict[int, list[float]] = {}
        for host, own in medians.items():
            core = self._cores.get(host)
            if core is not None:
                by_core.setdefault(core, []).append(own)
        for values in by_core.values():
            values.sort()
        references = {}
        for host, own in medians.items():
            core = self._cores.get(host)
            mates = by_core[core] if core is not None else []
            references[host] = median_without(mates if len(mates) > 1 else everyone, own)
        return references

    def _evaluate(self, step: int, reports: dict[int, float | None]) -> list[Finding]:
        # Every host of the world reported this step, so all of them warm up together.
        self._steps_seen += 1
        if self._steps_seen <= self.warmup or any(work is None for work in reports.values()):
            return []
        for host, work in reports.items():
            assert work is not None
            self._works[host].append(work)
        if len(self._hosts) < 2 or any(len(w) < self.window for w in self._works.values()):
            return []  # one host has no peer to compare with; a window must fill first
        medians = {host: statistics.median(works) for host, works in self._works.items()}
        references = self._references(medians)
        findings: list[Finding] = []
        for host, own in medians.items():
            reference = references[host]
            score = own / reference if reference > 0 else (math.inf if own > 0 else 1.0)
            self._scores[host] = score
            baseline = self._baselines.setdefault(host, score)
            over = (
                score >= self.threshold
                and score >= self.threshold * baseline
                and own - reference >= self.min_excess_seconds
            )
            self._streaks[host] = self._streaks[host] + 1 if over else 0
            if self._streaks[host] >= self.persistence and host not in self._flagged:
                self._flagged.add(host)
                findings.append(Finding(host, score, step, own, reference))
        return sorted(findings, key=lambda finding: finding.host)


def median_without(ordered: list[float], value: float) -> float:
    """The median of `ordered` (sorted, holding `value`) with one occurrence of `value` left out."""
    left_out = bisect.bisect_left(ordered, value)
    count = len(ordered) - 1

    def at(index: int) -> float:  # the index-th of the values left
        return ordered[index if index < left_out else index + 1]

    if count % 2:
        return at(count // 2)
    return (at(count // 2 - 1) + at(count // 2)) / 2
