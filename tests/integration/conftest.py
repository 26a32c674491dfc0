"""What the integration tests share: one fault-free run of the SDK example loop job."""

from __future__ import annotations

import pytest

from tests.support.cli_runs import run_job


@pytest.fixture(scope="session")
def clean_fingerprint(tmp_path_factory):
    """The parameters' fingerprint of the fault-free run (run_job's defaults): every faulty run of the
    same length must end with it."""
    result, report = run_job(tmp_path_factory.mktemp("clean"))
    assert result.returncode == 0, result.stderr
    assert report["restores"] == [] and report["hot_swaps"]["count"] == 0
    return report["params_fingerprint"]
