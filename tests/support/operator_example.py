"""The example TrainingJob (examples/trainingjob.yaml) as the operator tests apply it: in namespace
`NS`, its four pods named `NAMES` (two slices of two hosts), `example()` with changes to its spec."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from tests.support.cli_runs import ROOT

NS = "research"
EXAMPLE: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "trainingjob.yaml").read_text())
NAMES = ["tiny-lm-s0-w0", "tiny-lm-s0-w1", "tiny-lm-s1-w0", "tiny-lm-s1-w1"]


def example(**spec: Any) -> dict[str, Any]:
    job = copy.deepcopy(EXAMPLE)
    job["metadata"]["namespace"] = NS
    job["spec"].update(spec)
    return job
