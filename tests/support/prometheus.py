"""The chart's Prometheus rules as files Prometheus' own tools read, and those tools (Debian's
`prometheus` package: promtool and the server, which `make test` installs)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.support import chart

RULES_TEMPLATE = "slicekeeper/templates/rules.yaml"


def tool(name: str) -> str:
    """The path of Prometheus' `name` (promtool, prometheus); a clear failure if it is missing."""
    found = shutil.which(name)
    assert found, f"{name} is not installed: `make test` installs Debian's prometheus package"
    return found


def rule_groups(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rule groups of the chart's PrometheusRule, as rendered with `values`."""
    (rule,) = chart.rendered(values)[RULES_TEMPLATE]
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def write_rule_file(path: Path, values: dict[str, Any] | None = None) -> Path:
    """The PrometheusRule's groups as a Prometheus rule file (what the Prometheus Operator hands its
    Prometheus)."""
    path.write_text(yaml.safe_dump({"groups": rule_groups(values)}, sort_keys=False))
    return path


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *args], capture_output=True, text=True, timeout=120)


def alert(name: str, values: dict[str, Any] | None = None) -> dict[str, Any]:
    """The alerting rule `name` of the chart's rules."""
    (found,) = [r for g in rule_groups(values) for r in g["rules"] if r.get("alert") == name]
    return found


def expanded(template: str, labels: dict[str, str]) -> str:
    """An annotation with its `{{ $labels.x }}` filled in, as Prometheus fills it (annotations that use
    only labels)."""
    return re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels[m.group(1)], template)
