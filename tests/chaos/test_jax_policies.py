"""The issue's acceptance on the reference JAX job: elastic scale-down and back up under a user
policy that forbids hot-swap.

A scaled-down job keeps the global batch (gradient accumulation) and the learning-rate schedule, so
it trains on the same samples; its parameters equal a fault-free run's up to float summation order,
which is what is checked here (see docs/workload-sdk.md, "Elastic scaling"). The restarts are
checked like every chaos run's (tests/support/recovery_checks.py): the slice that comes back takes
its hosts' shards from their twins, the hosts of the same worker in the slice that stayed.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.cli_runs import ROOT
from tests.support.example_runs import STEPS, final_params, run_example
from tests.support.recovery_checks import problems, recovery_summary, tiers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.heavy]

NO_HOT_SWAP = str(ROOT / "examples" / "policies" / "no_hot_swap.py")


def test_a_policy_forbidding_hot_swap_scales_down_and_back_up_and_trains_the_same_model(tmp_path, clean):
    # The scale-up takes about 25 steps of the scaled-down job (3 s here): the spare comes at the
    # scaled-down job's first steps (offered once it trains), so the scale-up lands near step 40 of 70.
    chaos = "lose:host=3@step=15,spare:+1@step=16"
    report = run_example(tmp_path, "--spares", "1", "--policy", NO_HOT_SWAP, "--chaos", chaos)
    assert report["exit_code"] == 0, report["stderr"][-3000:]
    decided = [d for d in report["decisions"] if d["event"]["kind"] != "straggler"]
    assert [(d["event"]["kind"], d["action"]["name"], d["source"]) for d in decided] == [
        ("host_lost", "scale_down", "user"),
        ("capacity_returned", "scale_up", "user"),
    ]
    assert [w["hosts"] for w in report["world"]] == [4, 2, 4]
    assert report["hot_swaps"]["count"] == 0
    assert problems(report, steps=STEPS) == []
    [down, up] = report["recoveries"]
    assert (down["cause"], down["restore_step"], down["world"]) == ("host_lost", 10, [0, 1])
    assert tiers(report, down["generation"]) == {0: "local", 1: "local"}
    # The scale-up is planned; the slice coming back takes the steps only slice 0 trained from its twins.
    assert up["cause"] == "capacity_returned" and up["world"] == [0, 1, 2, 3] and up["restore_step"] > 10
    assert tiers(report, up["generation"]) == {0: "local", 1: "local", 2: "peer", 3: "peer"}
    assert recovery_summary(report)[0] == ("host_lost", 10, 4) and down["host"] == 3
    params, clean_params = final_params(tmp_path), clean["params"]
    assert params.keys() == clean_params.keys()
    for name, value in params.items():
        np.testing.assert_allclose(value, clean_params[name], rtol=1e-4, atol=1e-5, err_msg=name)
