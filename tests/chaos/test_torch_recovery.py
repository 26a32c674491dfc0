"""The acceptance runs on the reference PyTorch job (examples/trainingjob-torch.yaml): every fault kind,
hot-swap from a peer, scale-down and back up, each ending with the fault-free run's parameters.

The same checks as the JAX job's (test_jax_recovery.py, test_jax_policies.py) on the torch trainer
(workload/reference/torch_trainer.py), whose state is split over the hosts of a slice the same way
and checkpointed through the same SDK, so every tier, restore and check works unchanged. One thing
is stronger here: the torch trainer sums gradients in chunk order, so a job scaled down and back up
ends bit for bit with the fault-free fingerprint (the JAX job is checked up to float summation
order). Its negative control reduces in host order, as a reduce-scatter would, and must fail that
check.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli_runs import ROOT, processes_mentioning
from tests.support.example_runs import run_example
from tests.support.recovery_checks import detected_on, problems, recovery_summary, tiers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.heavy]

TORCH_EXAMPLE = yaml.safe_load((ROOT / "examples" / "trainingjob-torch.yaml").read_text())
TORCH_TRAINER = TORCH_EXAMPLE["spec"]["workload"]["command"]
HOST_ORDER_TRAINER = [sys.executable, str(ROOT / "tests" / "fixtures" / "torch_host_order_trainer.py")]
MISRESTORING = str(ROOT / "tests" / "fixtures" / "misrestoring_trainer.py")
NO_HOT_SWAP = str(ROOT / "examples" / "policies" / "no_hot_swap.py")
ELASTIC = ("--spares", "1", "--policy", NO_HOT_SWAP, "--chaos", "lose:host=1@step=30,spare:+1@step=45")
"""Slice 0 dropped: hosts 2 and 3 go on as ranks 0 and 1 (a rank that is not its host), then back.
Early in the run: the job must still be training when the scale-up, a few seconds of decisions and
restarts, is ready (STEPS)."""
STEPS = 160
"""Steps of every run here. A step costs 0.14 s of CPU, the four hosts together (a clean run: 300
steps 57.6 s, 100 steps 29.4 s), so the steps are most of a run's CPU. The elastic run needs the
most after its last fault: its scale-up, a few seconds of decisions and restarts, must be ready
before the end. It was back to four hosts at step 47-48 in the runs of stop 54 (loaded); in 120
steps it once was not, when a scale-up took longer (a fresh clone's `make test`, an earlier stop)."""


def run_torch(
    where: Path, *extra: str, command: list[str] = TORCH_TRAINER, standby: bool = True
) -> dict[str, Any]:
    """The example job with the torch trainer and the torch example's save interval; without a
    standby process where no restart is what a run checks (each costs a torch import, 2 s of CPU)."""
    interval = TORCH_EXAMPLE["spec"]["checkpoint"]["interval"]
    workload = {"command": command, "standby": standby}
    return run_example(where, *extra, steps=STEPS, workload=workload, checkpoint={"interval": interval})


@pytest.fixture(scope="module")
def torch_clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The fault-free run of the torch example job, once for this module."""
    report = run_torch(tmp_path_factory.mktemp("torch-clean"), standby=False)
    assert problems(report, steps=STEPS) == [], report["stderr"][-3000:]
    return report


def nothing_lost(report: dict[str, Any], clean: dict[str, Any]) -> list[str]:
    return problems(report, fingerprint=clean["params_fingerprint"], steps=STEPS)


def test_a_kill_a_lost_host_a_corrupt_copy_a_hang_and_a_slowdown_end_with_the_fault_free_parameters(
    tmp_path, torch_clean
):
    """The issue's acceptance run, every fault kind in one run, each after the previous one's restart:
    the spare takes the lost host's place from its twin's replica (and is then used up, so the
    slowed host is found and left training, the default policy's way without a spare); host 1's
    newest local copy is corrupted at the very moment its workload is hung, so that restart takes it
    from its twin. Both land when host 1's supervisor hears step 95 begin, which can be several
    30 ms steps after it began on a loaded machine: fired from one host at one instant, the copy
    corrupted is the newest host 1 will ever commit, whatever the delay (a corrupt fired before a
    hang on another host let a newer local step be committed in between: seen once in CI). The
    slowdown is 4-fold: the trainer's own work is ~5 ms a step, and the detector ignores excesses
    under 10 ms as scheduling noise."""
    chaos = (
        "kill:host=1@step=30,lose:host=2@step=60,corrupt:host=1@step=95,hang:host=1@step=95,"
        "slow:host=3,factor=4@step=115"
    )
    report = run_torch(tmp_path, "--spares", "1", "--chaos", chaos)
    assert report["exit_code"] == 0, report["stderr"][-3000:]
    assert nothing_lost(report, torch_clean) == []
    # Which step each restart restores depends on where a 30 ms step stood when the fault landed (a
    # hang's SIGSTOP may land a step later, inside the collective); that it is the newest every host
    # held is what nothing_lost checks.
    assert [cause for cause, _, _ in recovery_summary(report)] == ["crash", "host_lost", "hang"]
    assert detected_on(report)[:2] == [1, 2]
    assert report["hot_swaps"]["count"] == 1
    assert tiers(report, 2) == {0: "local", 1: "local", 2: "peer", 3: "local"}  # the spare took host 2
    # Step 90 unless the supervisor heard step 95 begin more than 5 steps late; either way the step
    # host 1 restores next, and from its twin, not from its corrupted local copy.
    [corrupt] = [f for f in report["faults"] if f["kind"] == "corrupt"]
    restored = {r["host"]: r["step"] for r in report["restores"] if r["generation"] == 3}
    assert corrupt["detail"].startswith(f"flipped bytes in local step {restored[1]},"), corrupt
    assert tiers(report, 3) == {0: "local", 1: "peer", 2: "local", 3: "local"}
    detected = {f["kind"]: f["detected_as"] for f in report["faults"]}
    assert detected == {
        "kill": "crash",
        "lose": "host_lost",
        "corrupt": None,
        "hang": "hang",
        "slow": "straggler",
    }
    # Found once a generation, never before it was slowed; with the spare used up, left training.
    found = [s for s in report["stragglers"] if s["host"] == 3]
    assert found and all(s["score"] > 1.3 and s["step"] > 115 for s in found), report["stragglers"]
    assert len(found) == 1 and len(report["recoveries"]) == 3, report["stragglers"]
    assert processes_mentioning(report["run_dir"]) == []


def test_scaled_down_and_back_up_it_trains_bit_for_bit_the_same_model(tmp_path, torch_clean):
    report = run_torch(tmp_path, *ELASTIC)
    assert report["exit_code"] == 0, report["stderr"][-3000:]
    assert [w["hosts"] for w in report["world"]] == [4, 2, 4]
    assert report["hot_swaps"]["count"] == 0
    [down, up] = report["recoveries"]
    assert (down["cause"], down["world"]) == ("host_lost", [2, 3])
    assert tiers(report, down["generation"]) == {2: "local", 3: "local"}
    # The slice coming back takes the steps only slice 1 trained from its twins.
    assert tiers(report, up["generation"]) == {0: "peer", 1: "peer", 2: "local", 3: "local"}
    assert nothing_lost(report, torch_clean) == []  # the exact fingerprint, not a tolerance


def test_reducing_in_host_order_is_caught_by_the_fingerprint_once_scaled_down(tmp_path, torch_clean):
    """The negative control: the scaled run of a trainer that adds each host's chunks first."""
    report = run_torch(tmp_path, *ELASTIC, command=HOST_ORDER_TRAINER, standby=False)
    assert [w["hosts"] for w in report["world"]] == [4, 2, 4]
    fingerprint = report["params_fingerprint"]
    assert problems(report, steps=STEPS) == []  # a good run in every other respect
    assert nothing_lost(report, torch_clean) == [
        f"final parameters {fingerprint} differ from the fault-free run's {torch_clean['params_fingerprint']}"
    ]


# --- negative control: each check catches the wrong restore it is there for, as on the JAX job -----


def run_misrestoring(where: Path, mode: str) -> dict[str, Any]:
    """The torch job with a kill at step 45 (restore step 40), its trainer restoring wrongly."""
    interval = TORCH_EXAMPLE["spec"]["checkpoint"]["interval"]
    env = [
        {"name": "SLICEKEEPER_TEST_MISRESTORE", "value": mode},
        {"name": "SLICEKEEPER_TEST_TRAINER", "value": "torch"},
    ]
    workload = {"command": [sys.executable, MISRESTORING], "env": env, "standby": False}
    return run_example(
        where,
        "--chaos",
        "kill:host=2@step=45",
        steps=STEPS,
        workload=workload,
        checkpoint={"interval": interval},
    )


def test_an_older_step_loaded_and_another_hosts_shard_are_each_caught_by_their_own_check(
    tmp_path, torch_clean
):
    """Both wrong restores in one run: every host loads the step an interval before the agreed one,
    and host 1 loads its slice neighbour's shards of it. The restore check names each host's step,
    the fingerprint sees host 1's slice part from its twins. That each is caught by its own check
    alone (an older step ends with the fault-free parameters; another host's shard passes the restore
    check) is shown on the JAX job (test_jax_recovery.py), through the same SDK restore and the same
    checks: here, that they see the torch trainer's restores.

    The kill is fired once the supervisor has read step 45's begin, which on a loaded machine
    was as late as step 50 (restore 50, not 40: a CI run). The agreed step is the newest every host
    held, which the restore check verifies; the trainer loads the one an interval before it."""
    report = run_misrestoring(tmp_path, "older-step,other-host:1")
    [(cause, agreed, _)] = recovery_summary(report)
    assert cause == "crash" and agreed in (40, 50)
    assert report["params_fingerprint"].startswith("diverged:1:")  # slice 1 disagrees with slice 0
    fingerprint, clean_fingerprint = report["params_fingerprint"], torch_clean["params_fingerprint"]
    interval = TORCH_EXAMPLE["spec"]["checkpoint"]["interval"]
    assert nothing_lost(report, torch_clean) == [
        f"final parameters {fingerprint} differ from the fault-free run's {clean_fingerprint}",
        *(
            f"generation 1 (crash): host {h}'s workload loaded step {agreed - interval}, not {agreed}"
            for h in range(4)
        ),
    ]
