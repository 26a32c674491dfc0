"""The pieces every slicekeeper dashboard is made of: the Prometheus data source, the namespace and
job variables, and panels built the same way (one query per series, a unit, a description)."""

from __future__ import annotations

from grafana_foundation_sdk.builders import common, prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders.dashboard import Dashboard, DatasourceVariable, QueryVariable
from grafana_foundation_sdk.models.common import GraphDrawStyle, StackingMode
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
JOB = 'namespace="$namespace", trainingjob="$trainingjob"'
"""The label matchers of the job the dashboard shows (its template variables)."""
HOST_ROLE = 'on (namespace, pod) group_left (host) slicekeeper_host_info{role="host"}'
"""Joined with a supervisor's series: the host of the job its machine plays (docs/supervisor.md)."""


def datasource_variable() -> DatasourceVariable:
    return DatasourceVariable("datasource").label("Prometheus").type("prometheus")


def _query_variable(name: str, label: str, values_of: str) -> QueryVariable:
    return (
        QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(values_of)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
    )


def namespace_variable() -> QueryVariable:
    return _query_variable("namespace", "Namespace", "label_values(slicekeeper_host_info, namespace)")


def job_variable() -> QueryVariable:
    values_of = 'label_values(slicekeeper_host_info{namespace="$namespace"}, trainingjob)'
    return _query_variable("trainingjob", "TrainingJob", values_of)


def board(name: str, uid: str, description: str, *, refresh: str = "30s", since: str = "now-6h") -> Dashboard:
    """A slicekeeper dashboard, its Prometheus chosen by the `datasource` variable."""
    return (
        Dashboard(f"slicekeeper / {name}")
        .uid(f"slicekeeper-{uid}")
        .tags(["slicekeeper"])
        .description(description)
        .refresh(refresh)
        .time(since, "now")
        .with_variable(datasource_variable())
    )


def job_board(name: str, uid: str, description: str) -> Dashboard:
    """A dashboard of one TrainingJob, chosen by the `namespace` and `trainingjob` variables."""
    return board(name, uid, description).with_variable(namespace_variable()).with_variable(job_variable())


def query(expr: str, legend: str = "", *, instant: bool = False) -> prometheus.Dataquery:
    found = prometheus.Dataquery().expr(expr).legend_format(legend or "__auto").datasource(DATASOURCE)
    return found.instant() if instant else found.range()


def series(
    title: str,
    description: str,
    *queries: prometheus.Dataquery,
    unit: str = "short",
    stacked: bool = False,
    bars: bool = False,
    width: int = 12,
    height: int = 8,
    minimum: float | None = None,
    maximum: float | None = None,
) -> timeseries.Panel:
    """A time series panel of `queries`; `stacked`: areas stacked (a whole split into parts)."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(height)
    )
    for each in queries:
        panel = panel.with_target(each)
    if stacked:
        panel = panel.stacking(common.StackingConfig().mode(StackingMode.NORMAL)).fill_opacity(60)
    if bars:
        panel = panel.draw_style(GraphDrawStyle.BARS).fill_opacity(80)
    if minimum is not None:
        panel = panel.min(minimum)
    if maximum is not None:
        panel = panel.max(maximum)
    return panel


def figure(title: str, description: str, expr: str, *, unit: str = "short", width: int = 6) -> stat.Panel:
    """One figure (the newest value of `expr`)."""
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(query(expr, instant=True))
        .unit(unit)
        .span(width)
        .height(4)
    )


def listing(title: str, description: str, *queries: prometheus.Dataquery, height: int = 10) -> table.Panel:
    """A table of instant queries, one row per series (the queries' labels as columns)."""
    panel = table.Panel().title(title).description(description).datasource(DATASOURCE).span(24).height(height)
    for each in queries:
        panel = panel.with_target(each.format(PromQueryFormat.TABLE))
    return panel
