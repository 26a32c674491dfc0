"""A supervisor's Prometheus metrics: the accountant's figures at scrape time, plus plain instruments."""

import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from slicekeeper.supervisor.metrics import SupervisorMetrics

from slicekeeper.goodput import BADPUT, Category, GoodputAccountant


def accountant_with_history() -> GoodputAccountant:
    """An hour-old accountant: startup, 20 productive seconds, then a checkpoint save still open."""
    start = time.time() - 3600.0
    accountant = GoodputAccountant(start=start)
    accountant.begin_step(1, start + 10.0, first_of_start=True)
    accountant.end_step(1, start + 40.0)
    accountant.begin_step(2, start + 40.0, first_of_start=False)
    accountant.end_step(2, start + 60.0)
    accountant.switch(Category.CHECKPOINT_SAVE, start + 60.0)
    return accountant


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of one scrape."""
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.fixture
def accountant():
    return accountant_with_history()


@pytest.fixture
def metrics(accountant):
    return SupervisorMetrics(lambda: accountant, registry=CollectorRegistry())


def test_productive_seconds_are_the_accountants(metrics):
    samples = scrape(metrics.registry)
    assert samples[("slicekeeper_productive_seconds_total", ())] == pytest.approx(20.0)


def test_there_is_a_badput_counter_for_every_category(metrics):
    samples = scrape(metrics.registry)
    categories = {
        dict(labels)["category"] for name, labels in samples if name == "slicekeeper_badput_seconds_total"
    }
    assert categories == {c.value for c in BADPUT}
    assert samples[("slicekeeper_badput_seconds_total", (("category", "program_startup"),))] == (
        pytest.approx(40.0)
    )
    assert samples[("slicekeeper_badput_seconds_total", (("category", "data_loading"),))] == 0.0


def test_the_exposition_text_names_every_badput_category(metrics):
    text = generate_latest(metrics.registry).decode()
    for category in BADPUT:
        assert f'slicekeeper_badput_seconds_total{{category="{category.value}"}}' in text
    assert "\nslicekeeper_productive_seconds_total " in text
    assert "\nslicekeeper_goodput_ratio " in text


def test_the_open_interval_is_counted_at_scrape_time(metrics):
    open_save = scrape(metrics.registry)[
        ("slicekeeper_badput_seconds_total", (("category", "checkpoint_save"),))
    ]
    assert open_save == pytest.approx(3600.0 - 60.0, abs=60.0)


def test_the_goodput_ratio_is_productive_over_wall_time(metrics):
    ratio = scrape(metrics.registry)[("slicekeeper_goodput_ratio", ())]
    assert ratio == pytest.approx(20.0 / 3600.0, rel=0.05)


def test_the_scrape_follows_the_accountant_the_supervisor_holds_now():
    holder = {"accountant": GoodputAccountant(start=time.time() - 10.0)}
    metrics = SupervisorMetrics(lambda: holder["accountant"], registry=CollectorRegistry())
    assert scrape(metrics.registry)[("slicekeeper_productive_seconds_total", ())] == 0.0
    holder["accountant"] = accountant_with_history()
    assert scrape(metrics.registry)[("slicekeeper_productive_seconds_total", ())] == pytest.approx(20.0)


def test_restarts_are_counted_by_kind(metrics):
    metrics.restarts.labels(kind="crash").inc()
    metrics.restarts.labels(kind="crash").inc()
    metrics.restarts.labels(kind="hang").inc()
    samples = scrape(metrics.registry)
    assert samples[("slicekeeper_restarts_total", (("kind", "crash"),))] == 2.0
    assert samples[("slicekeeper_restarts_total", (("kind", "hang"),))] == 1.0


def test_the_last_checkpoint_step_and_the_training_step_are_gauges(metrics):
    metrics.last_checkpoint_step.set(40)
    metrics.step.set(47)
    metrics.steps.inc(47)
    metrics.generation.set(2)
    metrics.hang_timeout.set(6.5)
    metrics.checkpoint_failures.labels(tier="local").inc()
    samples = scrape(metrics.registry)
    assert samples[("slicekeeper_last_checkpoint_step", ())] == 40.0
    assert samples[("slicekeeper_step", ())] == 47.0
    assert samples[("slicekeeper_steps_total", ())] == 47.0
    assert samples[("slicekeeper_restart_generation", ())] == 2.0
    assert samples[("slicekeeper_hang_timeout_seconds", ())] == 6.5
    assert samples[("slicekeeper_checkpoint_failures_total", (("tier", "local"),))] == 1.0


def test_step_durations_go_into_a_histogram(metrics):
    for duration in (0.04, 0.15, 0.15, 3.0):
        metrics.step_duration.observe(duration)
    samples = scrape(metrics.registry)
    assert samples[("slicekeeper_step_duration_seconds_count", ())] == 4.0
    assert samples[("slicekeeper_step_duration_seconds_sum", ())] == pytest.approx(3.34)
    assert samples[("slicekeeper_step_duration_seconds_bucket", (("le", "0.2"),))] == 3.0


def test_two_supervisors_in_one_process_keep_separate_registries(accountant):
    first = SupervisorMetrics(lambda: accountant, registry=CollectorRegistry())
    second = SupervisorMetrics(lambda: accountant, registry=CollectorRegistry())
    first.restarts.labels(kind="crash").inc()
    assert ("slicekeeper_restarts_total", (("kind", "crash"),)) not in scrape(second.registry)


def test_without_a_registry_each_supervisor_gets_its_own(accountant):
    first = SupervisorMetrics(lambda: accountant)
    second = SupervisorMetrics(lambda: accountant)
    assert first.registry is not second.registry


def test_the_metrics_are_served_over_http_on_the_port_returned(metrics):
    metrics.restarts.labels(kind="crash").inc()
    metrics.last_checkpoint_step.set(40)
    port = metrics.serve(0)
    assert port > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        body = response.read().decode()
    assert "slicekeeper_productive_seconds_total" in body
    assert 'slicekeeper_badput_seconds_total{category="infrastructure_recovery"}' in body
    assert "slicekeeper_goodput_ratio" in body
    assert 'slicekeeper_restarts_total{kind="crash"} 1.0' in body
    assert "slicekeeper_last_checkpoint_step 40.0" in body
