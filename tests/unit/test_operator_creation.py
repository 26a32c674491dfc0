"""Creating a job's pods as Kubernetes controllers do (operator/creation.py, slicekeeper/api_rules.py):
slow-start batches of 1, 2, 4, ... then a window, with at most `concurrency` in flight, stopping at
the first failure; every request through a token bucket of `qps` a second, `burst` deep."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from slicekeeper.operator.creation import batches, create_in_batches

from slicekeeper.api_rules import TokenBucket


def test_batches_double_up_to_the_limit():
    assert [len(b) for b in batches(range(100), 16)] == [1, 2, 4, 8, 16, 16, 16, 16, 16, 5]
    assert list(batches([], 8)) == []


class Recorder:
    """A create that takes a little while and notes how many run at once."""

    def __init__(self, fail: set[int] = frozenset(), there: set[int] = frozenset()) -> None:
        self.fail, self.there = fail, there
        self.made: list[int] = []
        self.in_flight = self.most = 0

    async def __call__(self, item: int) -> bool:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        self.made.append(item)
        if item in self.fail:
            raise RuntimeError(f"refused {item}")
        return item not in self.there


def test_every_item_is_created_with_at_most_the_concurrency_in_flight():
    create = Recorder(there={3, 4})
    assert asyncio.run(create_in_batches(range(40), create, concurrency=8)) == 38  # two were there (409)
    assert sorted(create.made) == list(range(40))
    assert 1 < create.most <= 8  # concurrent, and bounded


def test_a_failed_batch_stops_the_creation_and_its_error_is_raised():
    """Items 3-6 are the third batch (1, 2, 4): item 5 fails, so 7 and later are never tried."""
    create = Recorder(fail={5})
    with pytest.raises(RuntimeError, match="refused 5"):
        asyncio.run(create_in_batches(range(40), create, concurrency=8))
    assert sorted(create.made) == list(range(7))


def test_a_failure_in_the_window_stops_it_once_the_creates_in_flight_are_answered():
    create = Recorder(fail={20})
    with pytest.raises(RuntimeError, match="refused 20"):
        asyncio.run(create_in_batches(range(100), create, concurrency=4))
    assert create.in_flight == 0  # none left running
    assert 20 in create.made and max(create.made) <= 23  # only what was in flight with it


def test_after_the_slow_start_one_slow_create_holds_up_nothing_else():
    """A window, not batches, once a batch reaches the concurrency: item 10 answers only once item 39
    is made (or after 5 s), so in batches (the negative control: item 10's batch waits for it) 39
    comes after 10, in a window before."""
    create = Recorder()

    async def scenario() -> int:
        last_made = asyncio.Event()

        async def made(item: int) -> bool:
            if item == 10:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(last_made.wait(), 5)
            answer = await create(item)
            if item == 39:
                last_made.set()
            return answer

        return await create_in_batches(range(40), made, concurrency=4)

    assert asyncio.run(scenario()) == 40
    assert create.made.index(39) < create.made.index(10)
    assert create.most <= 4


def test_one_at_a_time_is_the_negative_control_of_concurrency():
    create = Recorder()
    asyncio.run(create_in_batches(range(10), create, concurrency=1))
    assert create.most == 1


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_bucket_lets_a_burst_through_then_paces_at_its_rate():
    clock = FakeClock()
    bucket = TokenBucket(qps=10.0, burst=5, clock=clock, sleep=clock.sleep)
    waits = [bucket.take() for _ in range(8)]
    assert waits[:5] == [0.0] * 5  # the burst
    assert waits[5:] == pytest.approx([0.1, 0.1, 0.1])  # then one every 1/qps
    clock.now += 10.0  # a quiet spell refills it, up to the burst
    assert [bucket.take() for _ in range(5)] == [0.0] * 5
    assert bucket.take() == pytest.approx(0.1)


def test_a_zero_rate_is_no_limit_and_a_bad_one_is_refused():
    clock = FakeClock()
    bucket = TokenBucket(qps=0.0, burst=1, clock=clock, sleep=clock.sleep)
    assert sum(bucket.take() for _ in range(1000)) == 0.0
    with pytest.raises(ValueError, match="qps >= 0 and burst >= 1"):
        TokenBucket(qps=-1.0, burst=1)


def test_the_scale_benchmark_prints_the_issues_headline_figures():
    from benchmarks.operator_scale_figures import Figures, summary

    figures = Figures(hosts=100, tpu_type="v5p-64", slices=25, hosts_per_slice=4, seconds_to_all_pods=2.0)
    figures.seconds_to_all_pods_at_50ms, figures.cpu_ms_per_pod, figures.hot_swap_writes = 3.0, 0.8, 4
    figures.operator_peak_mib, figures.operator_peak_mib_restart = 200.0, 300.0
    line = summary(figures)
    assert set(line) == {
        "hosts",
        "pods_seconds",
        "pods_seconds_at_50ms",
        "cpu_ms_per_pod",
        "restart_serving_seconds",
        "restart_replaced_seconds",
        "peak_rss_mib",
        "writes_per_hot_swap",
        "requests_per_pod",
    }
    assert line["peak_rss_mib"] == 300 and line["pods_seconds_at_50ms"] == 3.0
