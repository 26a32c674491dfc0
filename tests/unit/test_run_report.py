"""The end-of-run report: job-level goodput and badput over hosts, faults, restarts, fingerprint."""

import pytest

from slicekeeper.goodput import BADPUT, Category
from slicekeeper.report import build_report, format_report, merge_machines

STARTED = 1_700_000_000.0


def host_report(host: int, wall: float, **seconds: float) -> dict:
    """A supervisor's report.json: every category present, the given ones filled in."""
    filled = {c.value: 0.0 for c in Category}
    filled.update(seconds)
    return {
        "host": host,
        "slice": 0,
        "worker": host,
        "wall_seconds": wall,
        "seconds": filled,
        "productive_step_seconds": [0.5, 0.5, 0.5],
        "exit_code": 0,
        "last_checkpoint_step": 40,
        "typical_step_seconds": 0.5,
    }


def fault_record(**fields) -> dict:
    record = {
        "kind": "kill",
        "host": 1,
        "step": 30,
        "fired_at": STARTED + 20.0,
        "detected_at": STARTED + 21.5,
        "detected_as": "crash",
        "resumed_at": STARTED + 30.25,
        "productive_at": STARTED + 33.0,
        "high_water_at_detection": 31,
        "detected_in_generation": 0,
    }
    record.update(fields)
    return record


def summary(**fields) -> dict:
    value = {
        "state": "succeeded",
        "failure_reason": None,
        "generations": 2,
        "restarts": {"crash": 1},
        "faults": [fault_record()],
        "detections": [
            {
                "kind": "crash",
                "host": 1,
                "generation": 0,
                "detected_at": STARTED + 21.5,
                "detail": "workload killed by SIGKILL",
                "restore_step": 20,
            }
        ],
        "fingerprints": {"0": "ab" * 32, "1": "ab" * 32},
        "steps_completed": 100,
    }
    value.update(fields)
    return value


def two_hosts() -> list[dict]:
    return [
        host_report(0, 95.0, productive=60.0, program_startup=20.0, checkpoint_save=5.0, other=10.0),
        host_report(1, 98.0, productive=50.0, program_startup=18.0, infrastructure_recovery=30.0),
    ]


def report_of(hosts=None, wall: float = 100.0, **summary_fields) -> dict:
    return build_report(
        job_name="demo",
        started_at=STARTED,
        wall_seconds=wall,
        summary=summary(**summary_fields),
        hosts=two_hosts() if hosts is None else hosts,
    )


def test_goodput_and_badput_account_for_all_of_the_wall_time():
    report = report_of()
    badput = sum(report["badput_seconds"].values())
    assert report["goodput"] + badput / report["wall_seconds"] == pytest.approx(1.0, abs=1e-3)


def test_every_badput_category_is_reported_and_productive_is_not_badput():
    report = report_of()
    assert set(report["badput_seconds"]) == {c.value for c in BADPUT}
    assert Category.PRODUCTIVE.value not in report["badput_seconds"]


def test_job_level_figures_are_means_over_hosts():
    report = report_of()
    assert report["productive_seconds"] == pytest.approx(55.0)
    assert report["goodput"] == pytest.approx(0.55)
    assert report["badput_seconds"]["program_startup"] == pytest.approx(19.0)
    assert report["badput_seconds"]["checkpoint_save"] == pytest.approx(2.5)
    assert report["badput_seconds"]["infrastructure_recovery"] == pytest.approx(15.0)


def test_time_a_host_did_not_account_for_goes_to_other():
    report = report_of()
    # host 0: 10 s of its own other + 5 s outside its supervisor; host 1: 2 s outside
    assert report["badput_seconds"]["other"] == pytest.approx((15.0 + 2.0) / 2)


def test_a_host_that_accounted_longer_than_the_job_adds_no_negative_time():
    hosts = [host_report(0, 101.0, productive=101.0)]
    report = report_of(hosts=hosts)
    assert report["badput_seconds"]["other"] == 0.0


def test_per_host_goodput_is_that_hosts_productive_share_of_the_job_wall_time():
    report = report_of()
    assert [h["goodput"] for h in report["hosts"]] == [pytest.approx(0.6), pytest.approx(0.5)]
    assert [h["host"] for h in report["hosts"]] == [0, 1]
    assert report["hosts"][0]["last_checkpoint_step"] == 40


def test_the_fingerprint_is_kept_when_every_host_agrees():
    assert report_of()["params_fingerprint"] == "ab" * 32


def test_no_fingerprint_is_claimed_when_hosts_disagree():
    report = report_of(fingerprints={"0": "ab" * 32, "1": "cd" * 32})
    assert report["params_fingerprint"] is None


def test_no_fingerprint_is_claimed_when_a_host_did_not_report_one():
    assert report_of(fingerprints={"0": "ab" * 32, "1": None})["params_fingerprint"] is None


def test_no_fingerprint_is_claimed_when_no_host_reported_one():
    assert report_of(fingerprints={"0": None, "1": None})["params_fingerprint"] is None
    assert report_of(fingerprints={})["params_fingerprint"] is None


def test_fault_times_are_relative_to_the_start_with_detection_and_recovery_seconds():
    [fault] = report_of()["faults"]
    assert fault["fired_at"] == pytest.approx(20.0)
    assert fault["detected_at"] == pytest.approx(21.5)
    assert fault["resumed_at"] == pytest.approx(30.25)
    assert fault["productive_at"] == pytest.approx(33.0)
    assert fault["detection_seconds"] == pytest.approx(1.5)
    assert fault["recovery_seconds"] == pytest.approx(8.75)
    assert (fault["kind"], fault["host"], fault["step"], fault["detected_as"]) == ("kill", 1, 30, "crash")


def test_a_fault_never_detected_has_no_detection_or_recovery_time():
    faults = [fault_record(detected_at=None, detected_as=None, resumed_at=None, productive_at=None)]
    [fault] = report_of(faults=faults)["faults"]
    assert fault["detected_at"] is None
    assert fault["detection_seconds"] is None
    assert fault["recovery_seconds"] is None
    assert fault["fired_at"] == pytest.approx(20.0)


def test_a_fault_detected_but_never_recovered_has_no_recovery_time():
    [fault] = report_of(faults=[fault_record(resumed_at=None, productive_at=None)])["faults"]
    assert fault["detection_seconds"] == pytest.approx(1.5)
    assert fault["recovery_seconds"] is None


def test_detections_are_made_relative_too():
    [detection] = report_of()["detections"]
    assert detection["detected_at"] == pytest.approx(21.5)
    assert detection["restore_step"] == 20


def test_the_ideal_step_time_comes_from_every_hosts_productive_steps():
    hosts = two_hosts()
    hosts[1]["productive_step_seconds"] = [0.5, 0.5, 9.0]
    assert report_of(hosts=hosts)["ideal_step_seconds"] == pytest.approx(0.5)


def test_a_run_without_host_reports_is_all_other():
    report = report_of(hosts=[], state="failed", failure_reason="no supervisor started")
    assert report["goodput"] == 0.0
    assert report["productive_seconds"] == 0.0
    assert report["badput_seconds"]["other"] == pytest.approx(100.0)
    assert report["state"] == "failed"


def test_the_text_report_mentions_goodput_restarts_and_each_fault():
    second = fault_record(kind="hang", host=0, step=60, fired_at=STARTED + 50.0, detected_as="hang")
    second.update(detected_at=STARTED + 53.0, resumed_at=STARTED + 60.0)
    text = format_report(report_of(faults=[fault_record(), second], restarts={"crash": 1, "hang": 1}))
    assert text.startswith("job demo: succeeded")
    assert "goodput           0.550" in text
    assert "restarts          crash 1, hang 1" in text
    assert "fault kill host 1 @ step 30: detected as crash after 1.50 s, training again 8.75 s later" in text
    assert "fault hang host 0 @ step 60: detected as hang after 3.00 s, training again 7.00 s later" in text
    assert "params fingerprint " + "ab" * 8 + "..." in text


def test_the_text_report_says_when_nothing_restarted_and_a_fault_went_undetected():
    faults = [fault_record(detected_at=None, detected_as=None, resumed_at=None)]
    text = format_report(report_of(faults=faults, restarts={}))
    assert "restarts          none" in text
    assert "fault kill host 1 @ step 30: not detected" in text


def test_the_text_report_gives_the_failure_reason_and_the_biggest_badput_first():
    text = format_report(report_of(state="failed", failure_reason="restart budget spent"))
    assert text.splitlines()[0] == "job demo: failed (restart budget spent)"
    badput_lines = [line.split()[0] for line in text.splitlines() if line.startswith("    ")]
    assert badput_lines[0] == "program_startup"
    assert "data_loading" not in badput_lines  # nothing lost there


# --- hot-swaps: two machines serving one host identity --------------------------------------------


def machine_report(host: int | None, machine: str, wall: float, lost: bool = False, **seconds: float) -> dict:
    report = host_report(0 if host is None else host, wall, **seconds)
    report.update(host=host, machine=machine, lost=lost)
    return report


def swapped_hosts() -> list[dict]:
    """Host 1's machine was lost after 40 s; spare-0 took over for 55 s; spare-1 was never needed."""
    spare = machine_report(1, "spare-0", 55.0, productive=35.0, infrastructure_recovery=15.0)
    spare.update(productive_step_seconds=[0.6], last_checkpoint_step=90, exit_code=0)
    lost = machine_report(1, "host-1", 40.0, lost=True, productive=30.0, program_startup=10.0)
    lost.update(productive_step_seconds=[0.5, 0.5], last_checkpoint_step=20, exit_code=None)
    idle = machine_report(None, "spare-1", 100.0, other=100.0)
    return [machine_report(0, "host-0", 98.0, productive=70.0, other=28.0), spare, idle, lost]


def test_a_lost_machine_and_its_spare_add_up_to_one_host_listing_both_machines():
    hosts = merge_machines(swapped_hosts())
    assert [h["host"] for h in hosts] == [0, 1]
    host_1 = hosts[1]
    assert host_1["machines"] == ["host-1", "spare-0"]  # the lost machine first, whatever the order given
    assert host_1["wall_seconds"] == pytest.approx(95.0)
    assert host_1["seconds"]["productive"] == pytest.approx(65.0)
    assert host_1["seconds"]["program_startup"] == pytest.approx(10.0)
    assert host_1["seconds"]["infrastructure_recovery"] == pytest.approx(15.0)
    assert sorted(host_1["productive_step_seconds"]) == [0.5, 0.5, 0.6]
    # what the machine serving the host at the end knows wins
    assert host_1["last_checkpoint_step"] == 90
    assert host_1["exit_code"] == 0
    assert hosts[0]["machines"] == ["host-0"]


def test_each_hosts_own_figures_account_for_all_of_the_wall_time():
    report = report_of()
    for host in report["hosts"]:
        badput = sum(host["badput_seconds"].values())
        assert host["goodput"] + badput / report["wall_seconds"] == pytest.approx(1.0, abs=1e-3)
        assert host["productive_seconds"] == pytest.approx(host["goodput"] * report["wall_seconds"])
    assert report["hosts"][0]["badput_seconds"]["other"] == pytest.approx(15.0)  # 10 s its own, 5 s outside


def test_a_host_has_the_badput_restarts_and_faults_of_all_its_machines():
    hosts = swapped_hosts()
    hosts[1].update(restarts={"crash": 1}, faults={})  # spare-0, restarted once after taking host 1 over
    hosts[3].update(restarts={"crash": 1, "hang": 1}, faults={"crash": 1})  # host-1, then lost
    report = report_of(hosts=hosts)
    host_1 = report["hosts"][1]
    assert host_1["badput_seconds"]["infrastructure_recovery"] == pytest.approx(15.0)
    assert host_1["badput_seconds"]["other"] == pytest.approx(5.0)  # 100 s of wall, 95 s accounted
    assert host_1["restarts"] == {"crash": 2, "hang": 1}
    assert host_1["faults"] == {"crash": 1}
    assert report["hosts"][0]["restarts"] == {} and report["hosts"][0]["faults"] == {}


def test_the_report_keeps_when_the_run_started_for_the_times_of_its_event_logs():
    assert report_of()["started_at"] == STARTED


def test_an_unassigned_spare_is_not_a_host_of_the_report():
    merged = merge_machines(swapped_hosts())
    assert all("spare-1" not in h["machines"] for h in merged)
    report = report_of(hosts=swapped_hosts())
    assert [h["host"] for h in report["hosts"]] == [0, 1]
    assert report["hosts"][1]["machines"] == ["host-1", "spare-0"]
    # means over the two host identities only: (70 + 65) / 2; the idle spare's 100 s of other is not in
    assert report["productive_seconds"] == pytest.approx(67.5)
    assert report["goodput"] == pytest.approx(0.675)
    assert report["badput_seconds"]["other"] == pytest.approx((28.0 + 2.0 + 5.0) / 2)


def test_a_run_with_only_idle_spares_reporting_has_no_hosts():
    assert merge_machines([machine_report(None, "spare-0", 10.0)]) == []


RESTORES = [
    {"host": 0, "step": 10, "tier": "local", "holder": None, "generation": 1, "seconds": 0.1, "bytes": 100},
    {
        "host": 1,
        "step": 10,
        "tier": "persistent",
        "holder": None,
        "generation": 1,
        "seconds": 2.0,
        "bytes": 100,
    },
    {"host": 0, "step": 20, "tier": "local", "holder": None, "generation": 2, "seconds": 0.1, "bytes": 100},
    {"host": 1, "step": 20, "tier": "peer", "holder": 0, "generation": 2, "seconds": 0.4, "bytes": 100},
]
SWAPS = [{"host": 1, "spare": 0, "machine": "spare-0", "generation": 1}]


def tiered_report() -> dict:
    return report_of(
        hosts=swapped_hosts(),
        restores=RESTORES,
        hot_swaps=SWAPS,
        failed_saves={"local": 1, "persistent": 2},
        persistent_committed=[10],
        generations=3,
    )


def test_the_report_lists_every_restore_without_its_byte_count_with_the_step_its_workload_loaded():
    report = tiered_report()
    expected = [{**{k: v for k, v in r.items() if k != "bytes"}, "loaded_step": None} for r in RESTORES]
    assert report["restores"] == expected
    loaded = report_of(restores=[{**RESTORES[0], "loaded_step": 10}])["restores"]
    assert loaded[0]["loaded_step"] == 10


def test_persistent_reads_are_what_the_machines_persistent_tiers_counted_not_the_restores_labels():
    machines = swapped_hosts()
    machines[1]["persistent_reads"] = {"shards": 1, "objects": 3, "bytes": 4096}  # spare-0
    machines[3]["persistent_reads"] = {"shards": 0, "objects": 2, "bytes": 300}  # the lost host-1
    report = report_of(hosts=machines, restores=RESTORES)
    assert (report["persistent_reads"], report["persistent_read_bytes"]) == (1, 4396)
    # A restore labelled persistent that the store never served counts nothing.
    report = report_of(hosts=swapped_hosts(), restores=RESTORES)
    assert (report["persistent_reads"], report["persistent_read_bytes"]) == (0, 0)


RECOVERIES = [
    {
        "generation": 1,
        "cause": "host_lost",
        "host": 1,
        "stopped_at": STARTED + 40.0,
        "high_water": 14,
        "restore_step": 10,
        "steps_replayed": 4,
        "world": [0, 1],
        "held": {},
    },
    {
        "generation": 2,
        "cause": "crash",
        "host": 0,
        "stopped_at": STARTED + 70.0,
        "high_water": 22,
        "restore_step": 20,
        "steps_replayed": 2,
        "world": [0, 1],
        "held": {},
    },
]


def test_each_restart_is_reported_with_its_restore_step_and_the_steps_executed_again():
    report = report_of(restores=RESTORES, recoveries=RECOVERIES)
    assert [(r["generation"], r["restore_step"], r["steps_replayed"]) for r in report["recoveries"]] == [
        (1, 10, 4),
        (2, 20, 2),
    ]
    assert [r["stopped_at"] for r in report["recoveries"]] == [40.0, 70.0]  # seconds since the start


def test_hot_swaps_are_counted_with_their_hosts_and_details():
    assert tiered_report()["hot_swaps"] == {"count": 1, "hosts": [1], "details": SWAPS}


def test_failed_saves_and_persistent_checkpoints_come_from_the_summary():
    report = tiered_report()
    assert report["failed_saves"] == {"local": 1, "persistent": 2}
    assert report["persistent_checkpoints"] == [10]


def test_a_summary_without_tiers_gives_empty_tier_figures():
    report = report_of()
    assert report["restores"] == []
    assert report["persistent_reads"] == 0
    assert report["hot_swaps"] == {"count": 0, "hosts": [], "details": []}
    assert report["failed_saves"] == {}
    assert report["persistent_checkpoints"] == []


def test_the_text_report_shows_the_hot_swap_each_restarts_restore_and_failed_copies():
    text = format_report(tiered_report() | {"recoveries": RECOVERIES, "persistent_reads": 1})
    assert "  hot-swaps         1 (host 1 -> spare-0)" in text
    expected = (
        "  generation 1      host_lost on host 1 -> step 10 (host 0 local, host 1 persistent), 4 step(s)"
    )
    assert expected + " again" in text
    assert (
        "  generation 2      crash on host 0 -> step 20 (host 0 local, host 1 peer), 2 step(s) again" in text
    )
    assert "  restores          4 shard(s), 1 read from the persistent tier" in text
    assert "  failed copies     local 1, persistent 2" in text


def test_the_text_report_says_nothing_of_tiers_when_none_was_used():
    text = format_report(report_of())
    for absent in ("hot-swaps", "generation ", "restores ", "failed copies"):
        assert absent not in text
