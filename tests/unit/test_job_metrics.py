"""The job's series and a supervisor's role, as a scrape reads them: the leader's memory, its world
and its decisions, read when scraped, and nothing from a supervisor that does not lead."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from slicekeeper.supervisor.leader.job_metrics import JobCollector
from slicekeeper.supervisor.leader.journal import Detection, FaultRecord
from slicekeeper.supervisor.leader.restart_state import JobState, RestartState
from slicekeeper.supervisor.metrics import Role, SupervisorMetrics
from slicekeeper.supervisor.signals.straggler import StragglerDetector

from slicekeeper.goodput import GoodputAccountant
from tests.support.leader_views import LeaderView, leader_view

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _leader() -> LeaderView:
    return leader_view(detector=StragglerDetector(window=2, persistence=1, warmup=0, threshold=1.3))


def _scrape_registry(registry: CollectorRegistry) -> Samples:
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _scrape(collector: JobCollector) -> Samples:
    registry = CollectorRegistry()
    registry.register(collector)
    return _scrape_registry(registry)


def _fault(kind: str, host: int, detected: float, productive: float | None) -> FaultRecord:
    return FaultRecord(
        kind,
        host,
        step=10,
        fired_at=detected - 1,
        generation=0,
        detected_at=detected,
        productive_at=productive,
    )


def test_a_supervisor_that_does_not_lead_exports_no_job_series():
    leader: LeaderView | None = None
    collector = JobCollector(lambda: leader)
    assert _scrape(collector) == {}
    leader = _leader()  # elected: the same collector reads the leader now
    assert _scrape(collector)[("slicekeeper_job_step", ())] == 0


def test_the_job_series_are_the_leaders_memory_read_when_scraped():
    leader = _leader()
    collector = JobCollector(lambda: leader)
    memory = leader.memory
    memory.restart, memory.high_water = RestartState(JobState.RUNNING, generation=2), 42
    memory.restarts.update({"crash": 1, "hang": 1})
    memory.hot_swaps.append({"host": 1})
    memory.detections += [Detection("crash", 1, 0, 100.0, ""), Detection("hang", 2, 1, 200.0, "")]
    memory.faults += [
        _fault("kill", 1, 100.0, 106.5),
        _fault("hang", 2, 200.0, 230.0),
        _fault("kill", 3, 300.0, None),
    ]
    samples = _scrape(collector)
    states = {
        dict(labels)["state"]: value
        for (name, labels), value in samples.items()
        if name == "slicekeeper_job_state"
    }
    assert states == {state.value: float(state is JobState.RUNNING) for state in JobState}
    assert samples[("slicekeeper_job_step", ())] == 42 and samples[("slicekeeper_job_generation", ())] == 2
    assert samples[("slicekeeper_job_restarts_total", (("kind", "crash"),))] == 1
    assert samples[("slicekeeper_job_hot_swaps_total", ())] == 1
    assert samples[("slicekeeper_job_detections_total", (("kind", "hang"),))] == 1
    # Recovery: detected -> productive per recovered fault; the one not recovered yet is not counted.
    kill = (("kind", "kill"),)
    assert samples[("slicekeeper_job_recovery_seconds_count", kill)] == 1
    assert samples[("slicekeeper_job_recovery_seconds_sum", kill)] == 6.5
    assert samples[("slicekeeper_job_recovery_seconds_bucket", (("kind", "kill"), ("le", "5.0")))] == 0
    assert samples[("slicekeeper_job_recovery_seconds_bucket", (("kind", "kill"), ("le", "10.0")))] == 1
    assert samples[("slicekeeper_job_recovery_seconds_sum", (("kind", "hang"),))] == 30.0
    memory.high_water = 43
    assert _scrape(collector)[("slicekeeper_job_step", ())] == 43  # read at each scrape


def test_a_scale_down_shows_in_the_active_slices_and_hosts_and_is_counted():
    leader = _leader()
    collector = JobCollector(lambda: leader)
    before = _scrape(collector)
    assert before[("slicekeeper_job_slices", (("state", "active"),))] == 2
    assert before[("slicekeeper_job_scale_events_total", (("kind", "down"),))] == 0  # from 0
    previous = list(leader.world.active)
    leader.world.active = [0]
    leader.decisions.scaled("down", previous, 30, 1, "host_lost")
    after = _scrape(collector)
    assert after[("slicekeeper_job_slices", (("state", "active"),))] == 1
    assert after[("slicekeeper_job_slices", (("state", "full"),))] == 2
    assert after[("slicekeeper_job_hosts", (("state", "active"),))] == 2
    assert after[("slicekeeper_job_hosts", (("state", "full"),))] == 4
    assert after[("slicekeeper_job_devices", (("state", "active"),))] == 2  # one device per host here
    assert after[("slicekeeper_job_scale_events_total", (("kind", "down"),))] == 1
    assert after[("slicekeeper_job_scale_events_total", (("kind", "up"),))] == 0


def test_straggler_scores_and_findings_are_exported_per_host():
    leader = _leader()
    collector = JobCollector(lambda: leader)
    for host in range(4):
        leader.status[host].machine = f"m{host}"
    for step in range(1, 6):
        for host in range(4):
            work = 0.1 if host != 2 or step < 3 else 0.4  # host 2 becomes four times as slow
            leader.decisions.observe(host, step, work)
    samples = _scrape(collector)
    scores = {
        int(dict(labels)["host"]): value
        for (name, labels), value in samples.items()
        if name == "slicekeeper_straggler_score"
    }
    assert scores[2] > 2 and all(abs(scores[h] - 1) < 0.01 for h in (0, 1, 3))
    assert samples[("slicekeeper_straggler_flagged", (("host", "2"),))] == 1
    assert samples[("slicekeeper_straggler_flagged", (("host", "0"),))] == 0
    assert samples[("slicekeeper_job_stragglers_total", (("host", "2"),))] == 1
    assert samples[("slicekeeper_job_stragglers_total", (("host", "3"),))] == 0


def test_the_host_info_follows_the_role_a_machine_plays():
    role = Role("m4", None)
    metrics = SupervisorMetrics(lambda: GoodputAccountant(0.0))
    metrics.export_role(lambda: role)
    spare = (("host", ""), ("machine", "m4"), ("role", "spare"), ("slice", ""), ("worker", ""))
    assert _scrape_registry(metrics.registry)[("slicekeeper_host_info", spare)] == 1
    role = Role("m4", 3, slice=1, worker=1)  # it took over host 3
    infos = {k: v for k, v in _scrape_registry(metrics.registry).items() if k[0] == "slicekeeper_host_info"}
    playing = (("host", "3"), ("machine", "m4"), ("role", "host"), ("slice", "1"), ("worker", "1"))
    assert infos == {("slicekeeper_host_info", playing): 1}
