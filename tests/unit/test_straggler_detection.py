"""The straggler detector flags a host that stays slow, never a noisy one, from its own work per step.

Timings are synthetic and seeded: each host's own work is a base time with lognormal noise, a slow
host's work is multiplied by its factor from some step on.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from slicekeeper.supervisor.signals.straggler import Finding, StragglerDetector

Timeline = list[tuple[int, dict[int, float | None]]]
"""(step, {host: own work}) in step order."""


def own_work(
    *,
    seed: int,
    hosts: int = 4,
    steps: int,
    base: float = 0.1,
    sigma: float = 0.15,
    spike_rate: float = 0.0,
    slow: dict[int, tuple[int, float]] | None = None,
) -> Timeline:
    """Each host's own work per step; `slow` maps a host to (first slow step, factor)."""
    rng = random.Random(seed)
    timeline: Timeline = []
    for step in range(1, steps + 1):
        works: dict[int, float | None] = {}
        for host in range(hosts):
            work = base * rng.lognormvariate(0.0, sigma)
            if rng.random() < spike_rate:
                work *= 3.0  # one step of bad luck on one host: a page fault storm, a noisy neighbour
            start, factor = (slow or {}).get(host, (0, 1.0))
            if start and step >= start:
                work *= factor
            works[host] = work
        timeline.append((step, works))
    return timeline


def in_step_order(timeline: Timeline) -> Iterator[tuple[int, int, float | None]]:
    for step, works in timeline:
        for host, work in works.items():
            yield host, step, work


def shuffled(timeline: Timeline, *, seed: int, lag: int = 3) -> Iterator[tuple[int, int, float | None]]:
    """Reports as a leader receives them over one connection per host: each host's in order, the
    hosts interleaved at random, some up to `lag` steps ahead of others."""
    rng = random.Random(seed)
    queues = {host: [(host, step, works[host]) for step, works in timeline] for host in timeline[0][1]}
    while any(queues.values()):
        oldest = min(queue[0][1] for queue in queues.values() if queue)
        ready = [host for host, queue in queues.items() if queue and queue[0][1] < oldest + lag]
        yield queues[rng.choice(ready)].pop(0)


def detect(
    timeline: Timeline,
    detector: StragglerDetector | None = None,
    reports: Iterator[tuple[int, int, float | None]] | None = None,
) -> list[Finding]:
    if detector is None:
        detector = StragglerDetector()
        detector.reset(timeline[0][1])
    findings: list[Finding] = []
    for host, step, work in reports if reports is not None else in_step_order(timeline):
        findings += detector.observe(host, step, work)
    return findings


# --- the targets ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_a_healthy_noisy_run_with_spikes_flags_no_host(seed):
    timeline = own_work(seed=seed, steps=1000, sigma=0.15, spike_rate=0.02)
    assert detect(timeline) == []


@pytest.mark.parametrize("seed", range(8))
def test_a_host_slowed_one_and_a_half_times_is_flagged_within_30_steps(seed):
    timeline = own_work(seed=seed, steps=200, spike_rate=0.02, slow={2: (100, 1.5)})
    findings = detect(timeline)
    assert [f.host for f in findings] == [2]
    assert 100 <= findings[0].step < 130
    assert findings[0].score == pytest.approx(1.5, rel=0.2)


@pytest.mark.parametrize("seed", range(8))
def test_a_host_slowed_twice_is_flagged_within_15_steps(seed):
    timeline = own_work(seed=seed, steps=200, spike_rate=0.02, slow={1: (100, 2.0)})
    findings = detect(timeline)
    assert [f.host for f in findings] == [1]
    assert 100 <= findings[0].step < 115
    assert findings[0].score == pytest.approx(2.0, rel=0.2)


def test_in_a_synchronous_job_only_the_slow_host_scores_high_though_every_step_lasts_as_long():
    timeline = own_work(seed=3, steps=120, slow={2: (30, 2.0)})
    durations: Timeline = []
    for step, works in timeline:
        slowest = max(w for w in works.values() if w is not None)
        durations.append((step, dict.fromkeys(works, slowest)))  # everyone waits for the slowest

    by_work = StragglerDetector()
    by_work.reset(range(4))
    assert [f.host for f in detect(timeline, by_work)] == [2]
    scores = by_work.scores()
    assert scores[2] == pytest.approx(2.0, rel=0.2)
    assert all(scores[host] < 1.1 for host in (0, 1, 3))

    by_duration = StragglerDetector()
    by_duration.reset(range(4))
    assert detect(durations, by_duration) == []
    assert set(by_duration.scores().values()) == {1.0}


# --- persistence, warm-up, the size of an excess -------------------------------------------------


def test_a_few_slow_steps_in_a_row_are_not_a_straggler():
    timeline = own_work(seed=5, steps=200, sigma=0.05)
    for _, works in timeline[99:104]:  # steps 100..104: five steps at 3x, then normal again
        works[0] = 3 * (works[0] or 0.0)
    assert detect(timeline) == []


def test_the_first_steps_after_a_reset_are_not_scored():
    # A window of one step flagged at once: only the warm-up stands between compilation and a finding.
    hasty = {"window": 1, "persistence": 1, "warmup": 2}
    timeline = own_work(seed=6, steps=20, sigma=0.05)
    for _, works in timeline[:2]:
        works[3] = 50 * (works[3] or 0.0)  # compilation on host 3 only
    detector = StragglerDetector(**hasty)
    detector.reset(range(4))
    assert detect(timeline, detector) == []

    # The third step is the first scored (every host's baseline); a slow fourth step is flagged.
    timeline[3][1][3] = 50 * (timeline[3][1][3] or 0.0)
    detector = StragglerDetector(**hasty)
    detector.reset(range(4))
    assert [(f.host, f.step) for f in detect(timeline, detector)] == [(3, 4)]


def test_a_high_ratio_of_tiny_steps_is_not_a_straggler():
    timeline = own_work(seed=7, steps=200, base=0.001, sigma=0.05, slow={0: (50, 3.0)})
    assert detect(timeline) == []  # 3 ms against 1 ms: below min_excess_seconds
    sensitive = StragglerDetector(min_excess_seconds=0.0)
    sensitive.reset(range(4))
    assert [f.host for f in detect(timeline, sensitive)] == [0]


def test_with_two_hosts_the_slow_one_is_flagged_because_its_own_time_is_not_its_reference():
    timeline = own_work(seed=8, hosts=2, steps=120, slow={1: (40, 1.5)})
    findings = detect(timeline)
    assert [f.host for f in findings] == [1]
    assert findings[0].reference_seconds == pytest.approx(0.1, rel=0.2)
    assert findings[0].work_seconds == pytest.approx(0.15, rel=0.2)


def test_a_single_host_has_nobody_to_compare_with():
    timeline = own_work(seed=9, hosts=1, steps=100, slow={0: (10, 3.0)})
    detector = StragglerDetector()
    detector.reset([0])
    assert detect(timeline, detector) == []
    assert detector.scores() == {}


# --- findings and resets ---------------------------------------------------------------------------


def test_a_straggler_is_reported_once_per_reset_and_again_after_one():
    timeline = own_work(seed=10, steps=300, sigma=0.05, slow={3: (30, 2.0)})
    detector = StragglerDetector()
    detector.reset(range(4))
    assert [f.host for f in detect(timeline, detector)] == [3]
    assert detector.flagged == {3}

    detector.reset(range(4))
    assert detector.flagged == frozenset() and detector.scores() == {}
    again = detect(timeline[:60], detector)
    assert [f.host for f in again] == [3]


def test_a_reset_to_a_smaller_world_scores_only_its_hosts():
    detector = StragglerDetector()
    detector.reset([0, 1])
    detect(own_work(seed=11, steps=40, hosts=4), detector)
    assert set(detector.scores()) == {0, 1}


def test_scores_say_how_many_times_slower_each_host_is():
    timeline = own_work(seed=12, steps=60, sigma=0.05, slow={0: (1, 1.2)})
    detector = StragglerDetector()
    detector.reset(range(4))
    assert detect(timeline, detector) == []  # 1.2x: below the threshold, shown in the scores only
    scores = detector.scores()
    assert scores[0] == pytest.approx(1.2, rel=0.05)
    assert all(scores[host] == pytest.approx(1.0, rel=0.05) for host in (1, 2, 3))


# --- how the leader feeds it -----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_reports_in_any_order_give_the_same_findings_as_in_step_order(seed):
    timeline = own_work(seed=seed, steps=150, spike_rate=0.02, slow={2: (60, 2.0)})
    in_order = detect(timeline)
    detector = StragglerDetector()
    detector.reset(range(4))
    assert detect(timeline, detector, shuffled(timeline, seed=seed)) == in_order
    assert [f.host for f in in_order] == [2]


def test_a_finding_comes_with_the_report_that_completes_its_step():
    timeline = own_work(seed=13, steps=100, sigma=0.05, slow={1: (30, 2.0)})
    detector = StragglerDetector()
    detector.reset(range(4))
    for step, works in timeline:
        for host in (3, 2, 1):
            assert detector.observe(host, step, works[host]) == []
        findings = detector.observe(0, step, works[0])
        if findings:
            assert [(f.host, f.step) for f in findings] == [(1, step)]
            return
    pytest.fail("host 1 was never flagged")


def test_reports_from_outside_the_world_and_late_reports_are_ignored():
    timeline = own_work(seed=14, steps=100, sigma=0.05, slow={0: (30, 2.0)})
    detector = StragglerDetector()
    detector.reset(range(4))
    findings: list[Finding] = []
    for step, works in timeline:
        assert detector.observe(7, step, 100.0) == []  # a host of an older, larger world
        for host, work in works.items():
            findings += detector.observe(host, step, work)
        assert detector.observe(1, step, 100.0) == []  # a duplicate after the step was scored
    assert [f.host for f in findings] == [0]


def test_a_step_one_host_never_reported_is_dropped_and_detection_goes_on():
    timeline = own_work(seed=15, steps=100, sigma=0.05, slow={2: (30, 2.0)})
    del timeline[20][1][0]  # host 0's report of step 21 got lost
    reports = ((host, step, work) for step, works in timeline for host, work in works.items())
    assert [f.host for f in detect(timeline, None, reports)] == [2]


def test_without_work_reports_nothing_is_scored_or_flagged():
    timeline: Timeline = [(step, dict.fromkeys(range(4))) for step in range(1, 200)]
    detector = StragglerDetector()
    detector.reset(range(4))
    assert detect(timeline, detector) == []
    assert detector.scores() == {}


def test_a_step_some_host_reported_without_work_neither_extends_nor_breaks_a_streak():
    timeline = own_work(seed=16, steps=100, sigma=0.05, slow={1: (30, 2.0)})
    reference = detect(timeline)
    with_gaps: Timeline = timeline[:2]  # the warm-up as in the reference
    for step, works in timeline[2:]:
        with_gaps.append((step, works))
        with_gaps.append((step, {**works, 3: None}))  # a twin step that cannot be scored
    renumbered = [(index + 1, works) for index, (_, works) in enumerate(with_gaps)]
    findings = detect(renumbered)
    assert [f.host for f in findings] == [f.host for f in reference] == [1]
    assert findings[0].score == pytest.approx(reference[0].score)


@pytest.mark.parametrize(
    "settings",
    [{"window": 0}, {"persistence": 0}, {"warmup": -1}, {"threshold": 1.0}, {"min_excess_seconds": -1.0}],
)
def test_settings_that_cannot_work_are_refused(settings):
    with pytest.raises(ValueError):
        StragglerDetector(**settings)


def test_a_host_slower_from_the_start_is_how_the_hosts_are_until_it_slows_down_further():
    # Two hosts sharing two cores: the one that waits takes CPU from the other, a steady 2x.
    timeline = own_work(seed=21, hosts=2, steps=200, sigma=0.05, slow={0: (1, 2.0)})
    assert detect(timeline) == []
    worse = own_work(seed=21, hosts=2, steps=200, sigma=0.05, slow={0: (1, 2.0)})
    for _, works in worse[99:]:
        works[0] = 2.0 * (works[0] or 0.0)  # from step 100 on, twice as slow as it was
    [finding] = detect(worse)
    assert finding.host == 0 and 100 < finding.step <= 115
