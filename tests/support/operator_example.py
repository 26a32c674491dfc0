"""The example TrainingJob (examples/trainingjob.yaml) as the operator tests apply it: in namespace
`NS`, its four pods named `NAMES` (two slices of two hosts), `example()` with changes to its spec."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tests.support.cli_runs import ROOT

NS = "research"
EXAMPLE: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "trainingjob.yaml").read_text())
NAMES = ["tiny-lm-s0-w0", "tiny-lm-s0-w1", "tiny-lm-s1-w0", "tiny-lm-s1-w1"]
PROGRAMS_CLAIM = "compiled-programs"
"""The PersistentVolumeClaim (spec.workload.compilationCache.claimName) the pods of the session's
JAX jobs share, unless a test counts what a pod compiles."""


def shared_claims() -> Path:
    """The folder of the session's PersistentVolumeClaims (FakeTpuCluster's `claims`): the first JAX
    job of the session compiles the example's programs and the others load them, as a job's
    replacement pods do; each job's own checks are unchanged."""
    return Path(tempfile.gettempdir()) / "slicekeeper-test-claims"


def example(**spec: Any) -> dict[str, Any]:
    job = copy.deepcopy(EXAMPLE)
    job["metadata"]["namespace"] = NS
    job["spec"].update(spec)
    return job
