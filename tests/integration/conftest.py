"""What the integration tests share: the SDK example loop job's fault-free fingerprint, and the elastic
episode (a user policy forbidding hot-swap scales down and back up) that the policy tests check and the
simulator replays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cli_runs import ROOT, RUN_JOB_STEPS, run_job, sdk_loop_fingerprint

ELASTIC_STEPS = 120
NO_HOT_SWAP = str(ROOT / "examples" / "policies" / "no_hot_swap.py")


@pytest.fixture(scope="session")
def clean_fingerprint() -> str:
    """The parameters' fingerprint a fault-free run of run_job's default length (40 steps) ends with,
    computed (the SDK loop's data is a function of the step): every faulty run of that length must
    end with it. tests/integration/test_announced_losses_in_a_run.py checks a run against the same
    computation."""
    return sdk_loop_fingerprint(RUN_JOB_STEPS)


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
