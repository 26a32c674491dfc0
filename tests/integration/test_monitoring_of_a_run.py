"""The chart's recording rules and the dashboards' queries, run by a real Prometheus against a real
`slicekeeper run` with faults.

Prometheus (Debian's package) finds the supervisors through the file_sd entries each one writes
(`<run dir>/prometheus-targets/<machine>.json`, labelled as the chart's PodMonitor labels a pod),
scrapes them every second and evaluates the chart's rules, as rendered by the Helm engine. The run is the SDK
example loop with a crash, a lost host taken over by a spare and a hang. Once the job has recovered
from all three, every recording rule and every query of the Job goodput, Fleet and Hosts dashboards
(the job's variables filled in) must be accepted and return series; the recorded goodput must be
the supervisors' own figure. The Operator dashboard's queries need an operator: they are run against
one started as the chart deploys it (tests/operator/test_operator_as_the_chart_deploys_it.py).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from slicekeeper.supervisor.ports import free_port_block

from tests.support.cli_runs import (
    read_report,
    sdk_loop_fingerprint,
    sdk_loop_job,
    started_cli,
)
from tests.support.dashboards import committed, panel_queries
from tests.support.prometheus import rule_groups, write_rule_file
from tests.support.prometheus_server import Prometheus, QueryFailed, running_prometheus

HOSTS, SPARES, STEPS = 4, 1, 400
CHAOS = "kill:host=1@step=30,lose:host=2@step=60,hang:host=3@step=90"
JOB = {"namespace": "default", "trainingjob": "tiny-lm"}
PLAYING = 'slicekeeper_host_info{role="host"}'
PRODUCTIVE = "slicekeeper_productive_seconds_total"
BADPUT = "sum by (pod) (slicekeeper_badput_seconds_total)"
DASHBOARDS = ("job-goodput", "fleet", "hosts")

pytestmark = pytest.mark.timeout(420)


def _wait(prometheus: Prometheus, expr: str, what: str, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not prometheus.query(expr):
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what} ({expr})"
        time.sleep(1.0)


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """{expression: its result (a list of series) or the QueryFailed}, for every recording rule (its
    expression and the series it records) and every query of the job dashboards, evaluated once the
    run has recovered from its three faults; the run then ends with the fault-free parameters."""
    where = tmp_path_factory.mktemp("monitoring")
    work = where / "runs"
    job = sdk_loop_job(
        where / "job.yaml",
        steps=STEPS,
        local={"metricsPort": free_port_block(HOSTS + SPARES), "workDir": str(work), "spares": SPARES},
    )
    rules = write_rule_file(where / "rules.yaml")
    report_path = where / "report.json"
    found: dict[str, object] = {}
    with started_cli("run", str(job), "--report", str(report_path), "--chaos", CHAOS) as cli:
        run_dir = _run_directory(cli)
        targets = [str(run_dir / "prometheus-targets" / "*.json")]
        with running_prometheus(where, targets, [rules]) as prometheus:
            recovered = (
                'sum(max by (kind) (slicekeeper_job_recovery_seconds_count{trainingjob="tiny-lm"})) >= 3'
            )
            _wait(prometheus, recovered, "the job recovered from its three faults")
            _wait(prometheus, "slicekeeper:job_goodput:ratio_rate5m", "the goodput rule has data")
            at = time.time() - 1.0  # every answer of one moment, the rules evaluated by then
            for expr in [*expressions(), PLAYING, PRODUCTIVE, BADPUT]:
                try:
                    found[expr] = prometheus.query(expr, at=at)
                except QueryFailed as error:
                    found[expr] = error
        _, err = cli.communicate(timeout=300)
        assert cli.returncode == 0, err[-3000:]
    report = read_report(report_path)
    assert report["params_fingerprint"] == sdk_loop_fingerprint(STEPS)
    assert report["hot_swaps"]["count"] == 1
    return found


def _run_directory(cli: subprocess.Popen[str]) -> Path:
    assert cli.stdout is not None
    for line in cli.stdout:
        if "run directory:" in line:
            return Path(line.split("run directory:")[1].split()[0])
    raise AssertionError("the CLI ended without printing its run directory")


def expressions() -> list[str]:
    rules = [r for group in rule_groups() for r in group["rules"] if "record" in r]
    recorded = [r["record"] for r in rules] + [r["expr"] for r in rules]
    variables = {"namespace": JOB["namespace"], "trainingjob": JOB["trainingjob"]}
    panels = [
        query.filled(variables, rate_interval="30s", range_="2m")
        for name in DASHBOARDS
        for query in panel_queries(name, committed()[name])
    ]
    return recorded + panels


@pytest.mark.parametrize("expr", expressions())
def test_every_rule_and_panel_query_returns_series_from_the_run(answers, expr):
    answer = answers[expr]
    assert not isinstance(answer, QueryFailed), answer
    assert answer, "no series"


def _recording(name: str) -> str:
    """The expression of the recording rule `name`."""
    (expr,) = [r["expr"] for group in rule_groups() for r in group["rules"] if r.get("record") == name]
    return str(expr)


def _by_pod(result: object) -> dict[str, float]:
    return {series["metric"]["pod"]: float(series["value"][1]) for series in result}  # type: ignore[attr-defined]


def test_the_recorded_goodput_is_the_hosts_productive_over_wall_seconds(answers):
    """The rule's join: the machines that play a host now (the spare that took host 2 over among
    them), their productive seconds over all their seconds, as the report sums them."""
    (recorded,) = answers["slicekeeper:job_goodput:ratio"]  # type: ignore[misc]
    assert {k: recorded["metric"][k] for k in ("namespace", "trainingjob")} == JOB
    # The rule's expression at the moment the raw series below were read (what it records each second).
    (series,) = answers[_recording("slicekeeper:job_goodput:ratio")]  # type: ignore[misc]
    playing = {s["metric"]["pod"] for s in answers[PLAYING]}  # type: ignore[union-attr]
    assert "spare-0" in playing and "host-2" not in playing and len(playing) == HOSTS
    productive = _by_pod(answers[PRODUCTIVE])
    wall = {pod: productive[pod] + badput for pod, badput in _by_pod(answers[BADPUT]).items()}
    expected = sum(productive[p] for p in playing) / sum(wall[p] for p in playing)
    assert float(series["value"][1]) == pytest.approx(expected, rel=1e-6)
    assert 0.0 < expected < 1.0


def test_badput_is_recorded_by_category_with_the_faults_recovery_in_it(answers):
    recorded = answers["slicekeeper:job_badput_seconds:rate5m"]
    categories = {s["metric"]["category"] for s in recorded}  # type: ignore[union-attr]
    assert {"infrastructure_recovery", "program_startup"} <= categories
