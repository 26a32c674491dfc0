"""The chart's Grafana dashboards: generated from slicekeeper/dashboards and never stale, every panel
described, querying the job's Prometheus through the dashboard's data source, with PromQL that
Prometheus' own parser accepts (that each query returns data from a real run is
tests/integration/test_monitoring_of_a_run.py)."""

from __future__ import annotations

import pytest
import yaml

from slicekeeper.dashboards import DASHBOARDS, render
from tests.support.dashboards import FOLDER, committed, panel_queries
from tests.support.prometheus import promtool

JOB_DASHBOARDS = ("job-goodput", "hosts")


@pytest.mark.parametrize("name", DASHBOARDS)
def test_the_committed_dashboard_is_the_generated_one(name):
    stale = f"charts/slicekeeper/dashboards/{name}.json is stale: run `make dashboards`"
    assert (FOLDER / f"{name}.json").read_text() == render(name), stale


def test_every_dashboard_is_committed_and_nothing_else():
    assert set(committed()) == set(DASHBOARDS)


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_panel_is_described_and_asks_the_chosen_prometheus(name):
    dashboard = committed()[name]
    assert dashboard["uid"].startswith("slicekeeper-") and "slicekeeper" in dashboard["tags"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel.get("description"), panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


@pytest.mark.parametrize("name", JOB_DASHBOARDS)
def test_a_job_dashboard_chooses_its_namespace_and_job_and_every_query_uses_them(name):
    dashboard = committed()[name]
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource", "namespace", "trainingjob"]
    for query in panel_queries(name, dashboard):
        assert 'trainingjob="$trainingjob"' in query.expr, query.panel


def test_prometheus_parses_every_query(tmp_path):
    """Each query, its variables filled in, as a recording rule for promtool's parser; the control:
    a query with a missing bracket is refused."""
    queries = [q for name, d in committed().items() for q in panel_queries(name, d)]
    assert len(queries) >= 30
    variables = {"namespace": "default", "trainingjob": "tiny-lm"}
    rules = [{"record": f"check:query_{i}", "expr": q.filled(variables)} for i, q in enumerate(queries)]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "queries", "rules": rules}]}))
    checked = promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rules[0]["expr"] = rules[0]["expr"].replace(")", "", 1)
    path.write_text(yaml.safe_dump({"groups": [{"name": "queries", "rules": rules}]}))
    assert promtool("check", "rules", str(path)).returncode != 0
