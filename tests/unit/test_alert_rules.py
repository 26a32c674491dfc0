"""The chart's recording rules and alerts, checked and unit-tested by Prometheus' own promtool: each
alert fires on the series that should fire it, with its labels and annotations, and stays silent on
series that look alike but should not (another job, a job that is not running, a fault too short)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import chart
from tests.support.prometheus import alert, expanded, promtool, write_rule_file

JOB = {"namespace": "research", "trainingjob": "tiny-lm"}
CALM = {"namespace": "research", "trainingjob": "calm"}
DONE = {"namespace": "research", "trainingjob": "done"}


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{key}="{value}"' for key, value in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def expected(name: str, labels: dict[str, str]) -> dict[str, Any]:
    rule = alert(name)
    every = {**labels, **rule["labels"]}
    annotations = {key: expanded(text, every) for key, text in rule["annotations"].items()}
    return {"exp_labels": every, "exp_annotations": annotations}


def running(job: dict[str, str], minutes: int, state: str = "running") -> list[dict[str, str]]:
    pod = {**job, "pod": f"{job['trainingjob']}-s0-w0"}
    return [series("slicekeeper_job_state", {**pod, "state": state}, f"1x{minutes}")]


def host(job: dict[str, str], worker: int) -> dict[str, str]:
    """A supervisor's target labels (the PodMonitor's)."""
    return {**job, "pod": f"{job['trainingjob']}-s0-w{worker}"}


def goodput_inputs(job: dict[str, str], productive_per_minute: int, minutes: int) -> list[dict[str, str]]:
    """Two hosts of `job`, each productive `productive_per_minute` seconds of every 60."""
    found = []
    for worker in (0, 1):
        target = host(job, worker)
        info = {**target, "role": "host", "host": str(worker), "slice": "0", "worker": str(worker)}
        found += [
            series("slicekeeper_host_info", info, f"1x{minutes}"),
            series("slicekeeper_productive_seconds_total", target, f"0+{productive_per_minute}x{minutes}"),
            series(
                "slicekeeper_badput_seconds_total",
                {**target, "category": "infrastructure_recovery"},
                f"0+{60 - productive_per_minute}x{minutes}",
            ),
        ]
    return found


def waiting_spare(job: dict[str, str], minutes: int) -> list[dict[str, str]]:
    """A spare machine of `job` waiting, all its time `other`."""
    target = {**job, "pod": "spare-0"}
    info = {**target, "role": "spare", "host": "", "slice": "", "worker": ""}
    return [
        series("slicekeeper_host_info", info, f"1x{minutes}"),
        series("slicekeeper_productive_seconds_total", target, f"0x{minutes}"),
        series("slicekeeper_badput_seconds_total", {**target, "category": "other"}, f"0+60x{minutes}"),
    ]


TESTS: dict[str, dict[str, Any]] = {
    "goodput below the objective, while running only": {
        "input_series": [
            *goodput_inputs(JOB, 30, 90),  # 0.5
            *waiting_spare(JOB, 90),  # not one of its hosts: its idle time is not the job's
            *goodput_inputs(CALM, 57, 90),  # 0.95
            *goodput_inputs(DONE, 6, 90),  # 0.1, but the job is over
            *running(JOB, 90),
            *running(CALM, 90),
            *running(DONE, 90, state="succeeded"),
        ],
        "alert_rule_test": [
            {"eval_time": "3m", "alertname": "SlicekeeperGoodputLow"},  # not for 5 minutes yet
            {
                "eval_time": "70m",
                "alertname": "SlicekeeperGoodputLow",
                "exp_alerts": [expected("SlicekeeperGoodputLow", JOB)],
            },
        ],
        "promql_expr_test": [
            {
                "expr": "slicekeeper:job_goodput:ratio",
                "eval_time": "60m",
                "exp_samples": [
                    {"labels": "slicekeeper:job_goodput:ratio" + labels, "value": value}
                    for labels, value in (
                        ('{namespace="research",trainingjob="tiny-lm"}', 0.5),
                        ('{namespace="research",trainingjob="calm"}', 0.95),
                        ('{namespace="research",trainingjob="done"}', 0.1),
                    )
                ],
            }
        ],
    },
    "no step for ten minutes": {
        "input_series": [
            series("slicekeeper_job_step", host(JOB, 0), "0+1x10 10x30"),
            series("slicekeeper_job_step", host(CALM, 0), "0+1x40"),
            series("slicekeeper_job_step", host(DONE, 0), "0+1x5 5x35"),
            *running(JOB, 40),
            *running(CALM, 40),
            *running(DONE, 40, state="succeeded"),
        ],
        "alert_rule_test": [
            {"eval_time": "15m", "alertname": "SlicekeeperNoProgress"},  # stalled 5 minutes only
            {
                "eval_time": "25m",
                "alertname": "SlicekeeperNoProgress",
                "exp_alerts": [expected("SlicekeeperNoProgress", JOB)],
            },
        ],
    },
    "restarts faster than the rate": {
        "input_series": [
            series("slicekeeper_job_restarts_total", {**host(JOB, 0), "kind": "crash"}, "0+1x60"),
            series(
                "slicekeeper_job_restarts_total", {**host(CALM, 0), "kind": "crash"}, "0x30 1+0x15 2+0x15"
            ),
        ],
        "alert_rule_test": [
            {"eval_time": "3m", "alertname": "SlicekeeperRestartingOften"},
            {
                "eval_time": "60m",
                "alertname": "SlicekeeperRestartingOften",
                "exp_alerts": [expected("SlicekeeperRestartingOften", JOB)],
            },
        ],
    },
    "a straggler flagged": {
        "input_series": [
            series("slicekeeper_straggler_flagged", {**host(JOB, 0), "host": "2"}, "0x5 1x10"),
            series("slicekeeper_straggler_flagged", {**host(JOB, 0), "host": "1"}, "0x15"),
        ],
        "alert_rule_test": [
            {"eval_time": "4m", "alertname": "SlicekeeperStraggler"},
            {
                "eval_time": "10m",
                "alertname": "SlicekeeperStraggler",
                "exp_alerts": [expected("SlicekeeperStraggler", {**JOB, "host": "2"})],
            },
        ],
    },
    "checkpoint saves failing": {
        "input_series": [
            series("slicekeeper_checkpoint_failures_total", {**host(JOB, 1), "tier": "peer"}, "0x10 1x30"),
            series("slicekeeper_checkpoint_failures_total", {**host(JOB, 1), "tier": "local"}, "0x40"),
        ],
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "SlicekeeperCheckpointsFailing"},
            {
                "eval_time": "15m",
                "alertname": "SlicekeeperCheckpointsFailing",
                "exp_alerts": [expected("SlicekeeperCheckpointsFailing", {**JOB, "tier": "peer"})],
            },
            {"eval_time": "40m", "alertname": "SlicekeeperCheckpointsFailing"},  # none for 15 minutes
        ],
    },
    "scaled down for long": {
        "input_series": [
            series("slicekeeper_job_slices", {**host(JOB, 0), "state": "full"}, "2x50"),
            series("slicekeeper_job_slices", {**host(JOB, 0), "state": "active"}, "2x5 1x45"),
            series("slicekeeper_job_slices", {**host(CALM, 0), "state": "full"}, "2x50"),
            series("slicekeeper_job_slices", {**host(CALM, 0), "state": "active"}, "2x50"),
        ],
        "alert_rule_test": [
            {"eval_time": "30m", "alertname": "SlicekeeperScaledDown"},  # 25 minutes so far
            {
                "eval_time": "40m",
                "alertname": "SlicekeeperScaledDown",
                "exp_alerts": [expected("SlicekeeperScaledDown", JOB)],
            },
        ],
    },
    "the operator down": {
        "input_series": [
            series("up", {"job": f"{chart.NAMESPACE}/slicekeeper-operator", "pod": "op"}, "1x5 0x20"),
        ],
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "SlicekeeperOperatorDown"},
            {
                "eval_time": "15m",
                "alertname": "SlicekeeperOperatorDown",
                "exp_alerts": [expected("SlicekeeperOperatorDown", {})],
            },
        ],
    },
    "the operator never scraped": {
        "input_series": [series("up", {"job": "elsewhere/other", "pod": "x"}, "1x10")],
        "alert_rule_test": [
            {
                "eval_time": "10m",
                "alertname": "SlicekeeperOperatorDown",
                "exp_alerts": [expected("SlicekeeperOperatorDown", {})],
            },
        ],
    },
}


@pytest.fixture(scope="module")
def rule_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_rule_file(tmp_path_factory.mktemp("rules") / "slicekeeper.rules.yaml")


def test_promtool_finds_the_rules_valid_and_an_invalid_one_not(rule_file, tmp_path):
    checked = promtool("check", "rules", str(rule_file))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 12 rules found" in checked.stdout
    broken = yaml.safe_load(rule_file.read_text())
    broken["groups"][0]["rules"][0]["expr"] = "sum by (namespace (slicekeeper_productive_seconds_total)"
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(broken))
    assert promtool("check", "rules", str(tmp_path / "broken.yaml")).returncode != 0  # the control


def _unit_tests(rule_file: Path, tests: dict[str, dict[str, Any]], where: Path) -> Path:
    path = where / "tests.yaml"
    groups = [{"name": name, "interval": "1m", **group} for name, group in tests.items()]
    path.write_text(
        yaml.safe_dump({"rule_files": [str(rule_file)], "evaluation_interval": "1m", "tests": groups})
    )
    return path


def test_every_alert_fires_when_it_should_and_only_then(rule_file, tmp_path):
    tested = {case["alertname"] for group in TESTS.values() for case in group["alert_rule_test"]}
    assert tested == {
        r["alert"]
        for g in yaml.safe_load(rule_file.read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    result = promtool("test", "rules", str(_unit_tests(rule_file, TESTS, tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_unit_tests_catch_an_alert_that_never_fires(rule_file, tmp_path):
    """The control: with SlicekeeperNoProgress's threshold raised out of reach, its firing case fails."""
    rules = yaml.safe_load(rule_file.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "SlicekeeperNoProgress":
                rule["expr"] = rule["expr"].replace("== 0", "< 0")
    (tmp_path / "wrong.yaml").write_text(yaml.safe_dump(rules))
    only = {"no step for ten minutes": TESTS["no step for ten minutes"]}
    result = promtool("test", "rules", str(_unit_tests(tmp_path / "wrong.yaml", only, tmp_path)))
    assert result.returncode != 0 and "SlicekeeperNoProgress" in result.stdout + result.stderr
