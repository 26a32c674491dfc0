"""The Prometheus Operator's kinds (PodMonitor, PrometheusRule) checked against that operator's CRD
schemas, which kubernetes-validate does not hold: by @kubernetes-models/prometheus-operator's own
validation, in Node.js (`make test` installs the package under .venv/node)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.support.cli_runs import ROOT

NODE_DIR = ROOT / ".venv" / "node"
PACKAGE = NODE_DIR / "node_modules" / "@kubernetes-models" / "prometheus-operator"
SCRIPT = Path(__file__).with_suffix(".mjs")
KINDS = ("PodMonitor", "PrometheusRule", "ServiceMonitor")


def errors(objects: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """{(kind, name): what is wrong} for the objects of `objects` that break their CRD's schema."""
    node = shutil.which("node")
    assert node, "node is not installed (Node.js validates the Prometheus Operator's kinds)"
    assert PACKAGE.exists(), f"{PACKAGE} is missing: `make test` installs it"
    result = subprocess.run(
        [node, "--input-type=module", "-e", SCRIPT.read_text()],
        input="".join(json.dumps(o) + "\n" for o in objects),
        capture_output=True,
        text=True,
        cwd=NODE_DIR,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(answers) == len(objects), result.stdout
    return {(a["kind"], a["name"]): a["error"] for a in answers if a["error"] is not None}
