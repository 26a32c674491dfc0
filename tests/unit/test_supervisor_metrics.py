"""A supervisor's Prometheus metrics on a fresh registry: the documented names and types, and the
goodput collector, which reads the accountant at scrape time.

That the supervisor moves its instruments when steps, restarts, checkpoints and faults happen is
checked on real runs, scraped while they go on: tests/integration/test_metrics_of_a_running_job.py.
"""

from __future__ import annotations

import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from slicekeeper.supervisor.checkpoint_vocabulary import StoreReads
from slicekeeper.supervisor.leader.job_metrics import JobCollector
from slicekeeper.supervisor.metrics import Role, SupervisorMetrics

from slicekeeper.goodput import BADPUT, Category, GoodputAccountant
from tests.support.cli_runs import documented_metrics
from tests.support.leader_views import leader_view


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


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of one scrape."""
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.fixture
def accountant() -> GoodputAccountant:
    return accountant_with_history()


@pytest.fixture
def metrics(accountant: GoodputAccountant) -> SupervisorMetrics:
    metrics = SupervisorMetrics(lambda: accountant, registry=CollectorRegistry())
    metrics.count_store_reads(StoreReads(shards=2, objects=9, bytes=4096))  # a job with a persistent tier
    metrics.export_role(lambda: Role("m0", 0, slice=0, worker=0))
    leading = leader_view()
    metrics.export(JobCollector(lambda: leading))  # the supervisor that leads
    return metrics


# --- names, types, registries ----------------------------------------------------------------------


def test_the_metrics_are_exactly_the_documented_ones_with_their_types(metrics):
    exported = {}
    for family in metrics.registry.collect():
        name = f"{family.name}_total" if family.type == "counter" else family.name
        exported[name] = family.type
    assert exported == {name: metric.kind for name, metric in documented_metrics().items()}


def test_the_persistent_tiers_own_read_counts_are_exported(metrics):
    samples = scrape(metrics.registry)
    assert samples[("slicekeeper_persistent_shard_reads_total", ())] == 2
    assert samples[("slicekeeper_persistent_read_bytes_total", ())] == 4096


def test_the_badput_counter_has_one_child_per_badput_category(metrics):
    categories = {
        dict(labels)["category"]
        for name, labels in scrape(metrics.registry)
        if name == "slicekeeper_badput_seconds_total"
    }
    assert categories == {c.value for c in BADPUT}


def test_without_a_registry_each_supervisor_gets_its_own(accountant):
    first = SupervisorMetrics(lambda: accountant)
    second = SupervisorMetrics(lambda: accountant)
    assert first.registry is not second.registry


def test_the_metrics_are_served_over_http_on_the_port_returned(metrics):
    port = metrics.serve(0)
    assert port > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body = response.read().decode()
    [productive] = [
        line for line in body.splitlines() if line.startswith("slicekeeper_productive_seconds_total ")
    ]
    assert float(productive.split()[1]) == pytest.approx(20.0)


# --- the goodput collector -------------------------------------------------------------------------


def test_productive_and_badput_seconds_are_the_accountants(metrics):
    samples = scrape(metrics.registry)
    assert samples[("slicekeeper_productive_seconds_total", ())] == pytest.approx(20.0)
    badput = {
        dict(labels)["category"]: value
        for (name, labels), value in samples.items()
        if name == "slicekeeper_badput_seconds_total"
    }
    assert badput["program_startup"] == pytest.approx(40.0)  # 10 s before step 1, and step 1 itself
    assert badput["data_loading"] == 0.0


def test_an_open_interval_a_fault_could_take_back_is_not_counted_until_it_closes(metrics):
    # The checkpoint save opened an hour ago is still open: a fault would book it as recovery.
    badput = scrape(metrics.registry)
    assert badput[("slicekeeper_badput_seconds_total", (("category", "checkpoint_save"),))] == 0.0


def test_open_recovery_and_scaled_down_time_is_counted_at_scrape_time():
    """No fault takes those back: a host parked for an hour shows its hour, not 0 until it resumes."""
    for category in (Category.SCALED_DOWN, Category.INFRASTRUCTURE_RECOVERY):
        accountant = accountant_with_history()
        accountant.switch(category, accountant.start + 60.0)
        metrics = SupervisorMetrics(lambda accountant=accountant: accountant, registry=CollectorRegistry())
        seconds = scrape(metrics.registry)[
            ("slicekeeper_badput_seconds_total", (("category", category.value),))
        ]
        assert seconds == pytest.approx(3600.0 - 60.0, abs=60.0)


def test_the_goodput_ratio_is_productive_over_wall_time(metrics):
    ratio = scrape(metrics.registry)[("slicekeeper_goodput_ratio", ())]
    assert ratio == pytest.approx(20.0 / 3600.0, rel=0.05)


def test_the_scrape_follows_the_accountant_the_supervisor_holds_now():
    """A spare taking over a host starts a fresh accountant: the endpoint must show that one."""
    holder = {"accountant": GoodputAccountant(start=time.time() - 10.0)}
    metrics = SupervisorMetrics(lambda: holder["accountant"], registry=CollectorRegistry())
    assert scrape(metrics.registry)[("slicekeeper_productive_seconds_total", ())] == 0.0
    holder["accountant"] = accountant_with_history()
    assert scrape(metrics.registry)[("slicekeeper_productive_seconds_total", ())] == pytest.approx(20.0)
