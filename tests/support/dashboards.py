"""The chart's Grafana dashboards as a test reads them: each panel's PromQL, with the template
variables filled in as Grafana fills them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tests.support import chart

FOLDER = chart.CHART / "dashboards"


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    expr: str

    def filled(self, variables: dict[str, str], rate_interval: str = "1m", range_: str = "5m") -> str:
        """The expression as Grafana sends it: `$name` replaced, `$__rate_interval` and `$__range`
        given."""
        expr = self.expr.replace("$__rate_interval", rate_interval).replace("$__range", range_)
        for name, value in sorted(variables.items(), key=lambda item: -len(item[0])):
            expr = expr.replace(f"${name}", value)
        return expr


def committed() -> dict[str, dict[str, Any]]:
    """{file name without .json: the dashboard} of charts/slicekeeper/dashboards."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(FOLDER.glob("*.json"))}


def panel_queries(name: str, dashboard: dict[str, Any]) -> list[PanelQuery]:
    """Every query of every panel of `dashboard`, and its annotations' queries."""
    found = [
        PanelQuery(name, panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]
    found += [
        PanelQuery(name, f"annotation {a['name']}", a["expr"])
        for a in dashboard.get("annotations", {}).get("list", [])
        if a.get("expr")
    ]
    return found
