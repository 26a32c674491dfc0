"""slicekeeper's Grafana dashboards, as code (grafana-foundation-sdk).

A build tool of the Helm chart, not a part of the running system: `make dashboards` writes each
dashboard's JSON into charts/slicekeeper/dashboards/, which the chart ships as ConfigMaps for
Grafana's dashboard sidecar, and a test fails when the committed JSON is stale. Every panel reads
the series the supervisors and the operator export and the chart's recording rules
(charts/slicekeeper/templates/rules.yaml); docs/install.md describes each panel.
"""

from __future__ import annotations

from collections.abc import Callable

from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from slicekeeper.dashboards import fleet, hosts, job, operator

DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    "job-goodput": job.dashboard,
    "fleet": fleet.dashboard,
    "hosts": hosts.dashboard,
    "operator": operator.dashboard,
}
"""File name (without .json) -> the dashboard's builder."""


def render(name: str) -> str:
    """The JSON of dashboard `name`, as committed (stable key order, a final newline); its panels
    numbered 1, 2, ... in order (Grafana wants each panel's id unique in its dashboard)."""
    built = DASHBOARDS[name]().build()
    for number, panel in enumerate(built.panels or [], start=1):
        panel.id_val = number
    return JSONEncoder(sort_keys=True, indent=2).encode(built) + "\n"
