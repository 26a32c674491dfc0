"""The training process cannot read the job's credentials, nor its supervisor's memory (where the key
is once loaded), and trains as before (supervisor.host.confinement): a workload that tries, under
`slicekeeper run`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from slicekeeper.supervisor.host.confinement import landlock_abi

from tests.support.cli_runs import ROOT, SDK_LOOP, run_job, sdk_loop_fingerprint

THIEF = ROOT / "tests" / "fixtures" / "credential_thief.py"
STEPS = 20

pytestmark = pytest.mark.skipif(landlock_abi() == 0, reason="no Landlock on this kernel")


def test_a_workload_that_tries_to_read_the_credentials_fails_and_the_job_trains_on(tmp_path: Path):
    outcomes = tmp_path / "outcomes"
    workload = {"command": [sys.executable, str(THIEF), str(outcomes), str(SDK_LOOP)]}
    result, report = run_job(tmp_path / "run", steps=STEPS, workload=workload)
    assert result.returncode == 0, result.stderr[-3000:]
    assert report is not None and report["params_fingerprint"] == sdk_loop_fingerprint(STEPS)
    tried = {path.name: json.loads(path.read_text()) for path in sorted(outcomes.glob("host-*.json"))}
    assert len(tried) == 4
    for host, outcome in tried.items():
        assert outcome == {
            "key": "PermissionError",
            "credentials": "PermissionError",
            "supervisor_memory": "PermissionError",
            "own_socket_dir": "read",  # what it is handed stays its own
        }, host
