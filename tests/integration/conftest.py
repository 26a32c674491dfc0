"""What the integration tests share: one fault-free run of the SDK example loop job, and the elastic
episode (a user policy forbidding hot-swap scales down and back up) that the policy tests check and the
simulator replays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cli_runs import ROOT, run_job
from tests.support.shared_runs import once_per_run

ELASTIC_STEPS = 120
NO_HOT_SWAP = str(ROOT / "examples" / "policies" / "no_hot_swap.py")


@pytest.fixture(scope="session")
def clean_fingerprint(tmp_path_factory):
    """The parameters' fingerprint of the fault-free run (run_job's defaults): every faulty run of the
    same length must end with it. Once per test run (tests/support/shared_runs.py)."""
    return once_per_run(tmp_path_factory, "sdk-loop-clean", _fault_free_fingerprint)


def _fault_free_fingerprint(where: Path) -> str:
    result, report = run_job(where)
    assert result.returncode == 0, result.stderr
    assert report is not None and report["restores"] == [] and report["hot_swaps"]["count"] == 0
    return str(report["params_fingerprint"])


@pytest.fixture(scope="session")
def elastic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The issue's acceptance run: a spare waits, but the user's policy forbids hot-swap. Once per
    worker, not shared between workers: the simulator's replay (an `alone` test) predicts another run
    from its costs, and makes it in its own turn when its worker has not made it yet."""
    where = tmp_path_factory.mktemp("elastic")
    result, report = run_job(
        where,
        "--spares",
        "1",
        "--policy",
        NO_HOT_SWAP,
        "--chaos",
        "lose:host=3@step=40,spare:+1@step=60",
        steps=ELASTIC_STEPS,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert report is not None
    return where, report
