"""The acceptance runs on the reference JAX job: every fault kind, nothing lost, state from the right place.

The job's state is split over the hosts of a slice and replicated over its two slices, so a host's
shard exists only on its own disk, on its twin's in the other slice, in peer replicas and in the
persistent tier: restoring the wrong one changes the result. Each run fires several faults and is
checked three ways:

- its final parameters equal the fault-free run's (`clean`, tests/conftest.py; one device a host,
  as every suite run of the example job: the first run below has the example's two, and a
  fault-free run of its own);
- every restart restored the newest step every host held, each host loaded exactly that step, and
  the steps executed again are the ones after it (tests/support/recovery_checks.py), with the exact
  steps and tiers this schedule must give: a fault at step S stops the job after step S - 1, and
  checkpoints are every 5 steps (persistent every 30);
- what the persistent tier served, counted by the tier itself.

The negative controls run a trainer that restores wrongly on purpose (tests/fixtures/
misrestoring_trainer.py) and show each check catching what it is there for: a restore of an older
step ends with the fault-free parameters and only the restore check sees it; a host loading another
host's shard passes the restore check and only the fingerprint sees it.
"""

from __future__ import annotations

import sys

import pytest

from tests.support.cli_runs import ROOT, processes_mentioning
from tests.support.example_runs import STEPS, clean_run, run_example
from tests.support.recovery_checks import detected_on, problems, recovery_summary, tiers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.heavy]

MISRESTORING = str(ROOT / "tests" / "fixtures" / "misrestoring_trainer.py")
SHORT_STEPS = 20
"""Steps of a run that needs one restart and no comparison with the fault-free run."""


def nothing_lost(report, clean) -> list[str]:
    return problems(report, fingerprint=clean["report"]["params_fingerprint"], steps=STEPS)


@pytest.fixture(scope="module")
def clean_two_devices(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The fault-free run with the example's own two devices a host (the suite's runs have one:
    tests/support/example_runs.py, DEVICES_PER_HOST), for the run below."""
    return clean_run(tmp_path_factory.mktemp("clean-two-devices"), devices_per_host=2)


def test_kill_corrupt_hang_and_slow_restore_the_newest_steps_and_end_with_the_fault_free_parameters(
    tmp_path, clean_two_devices
):
    # Host 1's newest local copy is corrupted at the instant its workload is hung (fired from one
    # host at one instant, the copy corrupted is the newest host 1 will commit, however late its
    # supervisor hears the step begin; a hang elsewhere two steps later let step 40 be committed).
    # With two devices a host, as the example job has: each host's shard is two devices' blocks
    # (the `model` axis), each saved, replicated and restored to its own device.
    chaos = "kill:host=2@step=20,corrupt:host=1@step=38,hang:host=1@step=38,slow:host=3,factor=2@step=50"
    report = run_example(tmp_path, "--spares", "0", "--chaos", chaos, local={"devicesPerHost": 2})
    assert nothing_lost(report, clean_two_devices) == []
    assert recovery_summary(report) == [("crash", 15, 4), ("hang", 35, 2)]
    assert detected_on(report)[0] == 2
    assert tiers(report, 1) == {0: "local", 1: "local", 2: "local", 3: "local"}
    # Host 1's local copy of step 35 was corrupted: found at the restore, taken from its twin's replica.
    corrupt = next(f for f in report["faults"] if f["kind"] == "corrupt")
    assert corrupt["detail"].startswith("flipped bytes in local step 35")
    assert tiers(report, 2) == {0: "local", 1: "peer", 2: "local", 3: "local"}
    assert report["restarts"] == {"crash": 1, "hang": 1}
    assert [(f["kind"], f["detected_as"]) for f in report["faults"]] == [
        ("kill", "crash"),
        ("corrupt", None),
        ("hang", "hang"),
        ("slow", "straggler"),
    ]
    # The slowed machine is found (others may be too on a loaded machine; docs/benchmarks.md), never
    # before it was slowed; with no spare the default policy leaves it training.
    [straggler] = [s for s in report["stragglers"] if s["host"] == 3]
    assert straggler["score"] > 1.3 and straggler["step"] > 50
    assert all(s["step"] > 50 for s in report["stragglers"])
    assert report["persistent_reads"] == 0 and report["persistent_read_bytes"] == 0
    assert processes_mentioning(report["run_dir"]) == []


def test_two_lost_hosts_are_hot_swapped_from_their_twins_replicas_though_the_persistent_tier_has_them(
    tmp_path, clean
):
    # Every checkpoint also goes to the persistent tier: the restored steps are there too, and the
    # store serving nothing shows the peer copies were preferred.
    chaos = "lose:host=1@step=35,lose:host=2@step=50"
    report = run_example(tmp_path, "--spares", "2", "--chaos", chaos, persistent_interval=5)
    assert nothing_lost(report, clean) == []
    assert recovery_summary(report) == [("host_lost", 30, 4), ("host_lost", 45, 4)]
    assert detected_on(report) == [1, 2]
    assert tiers(report, 1) == {0: "local", 1: "peer", 2: "local", 3: "local"}
    assert tiers(report, 2) == {0: "local", 1: "local", 2: "peer", 3: "local"}
    holders = {(r["generation"], r["host"]): r["holder"] for r in report["restores"] if r["tier"] == "peer"}
    assert holders == {(1, 1): 3, (2, 2): 0}  # each from its twin on the other slice
    assert [(s["host"], s["machine"]) for s in report["hot_swaps"]["details"]] == [
        (1, "spare-0"),
        (2, "spare-1"),
    ]
    # The leader planned each restore knowing steps 30 and 45 whole in the persistent tier (what it
    # held then, recorded with the recovery): the peers were preferred all the same. (Not "committed
    # before the loss": the upload of step 45 may still be under way at the loss, five steps after its
    # save on a loaded machine, as on a fresh clone of ff60cc6; what the decision saw is what counts.)
    for recovery, step in zip(report["recoveries"], (30, 45), strict=True):
        assert recovery["restore_step"] == step
        assert sorted(recovery["held"]["persistent"].get(str(step), [])) == [0, 1, 2, 3], recovery["held"]
    assert report["persistent_reads"] == 0 and report["persistent_read_bytes"] == 0
    assert processes_mentioning(report["run_dir"]) == []


def test_a_lost_host_without_peer_copies_restores_every_shard_from_the_persistent_tier(tmp_path, clean):
    report = run_example(
        tmp_path, "--spares", "1", "--chaos", "lose:host=1@step=47", checkpoint={"peer": {"replicas": 0}}
    )
    assert nothing_lost(report, clean) == []
    # Host 1's shard exists only in the persistent step 30; the others' local tiers kept 35-45 only.
    assert recovery_summary(report) == [("host_lost", 30, 16)]
    assert tiers(report, 1) == {0: "persistent", 1: "persistent", 2: "persistent", 3: "persistent"}
    assert report["persistent_reads"] == 4 and report["persistent_read_bytes"] > 0
    assert processes_mentioning(report["run_dir"]) == []


# --- negative controls: each check catches the wrong restore it is there for ---------------------


def run_misrestoring(tmp_path, mode: str) -> dict:
    """The acceptance job with a kill at step 20 (restore step 15), its trainer restoring wrongly. No
    standby process: what is checked is the restore, not how its process was started."""
    workload = {
        "command": [sys.executable, MISRESTORING],
        "env": [{"name": "SLICEKEEPER_TEST_MISRESTORE", "value": mode}],
        "standby": False,
    }
    return run_example(tmp_path, "--chaos", "kill:host=2@step=20", workload=workload)


def test_a_restore_of_an_older_step_ends_with_the_right_parameters_and_is_caught_by_the_restore_check(
    tmp_path, clean
):
    report = run_misrestoring(tmp_path, "older-step")
    assert report["params_fingerprint"] == clean["report"]["params_fingerprint"]  # it cannot tell
    found = nothing_lost(report, clean)
    assert found == [f"generation 1 (crash): host {h}'s workload loaded step 10, not 15" for h in range(4)]


def test_a_host_loading_another_hosts_shard_passes_the_restore_check_and_is_caught_by_the_fingerprint(
    tmp_path, clean
):
    report = run_misrestoring(tmp_path, "other-host:1")
    assert recovery_summary(report) == [("crash", 15, 4)]
    assert report["params_fingerprint"].startswith("diverged:1:")  # slice 1 disagrees with slice 0
    fingerprint, clean_fingerprint = report["params_fingerprint"], clean["report"]["params_fingerprint"]
    assert nothing_lost(report, clean) == [
        f"final parameters {fingerprint} differ from the fault-free run's {clean_fingerprint}"
    ]


def test_a_restart_whose_compiled_programs_cannot_be_used_is_caught_compiling_them_again(
    tmp_path, monkeypatch
):
    # The control of the check every run above passes (recovery_checks.compiled_again): a compilation
    # cache others may write to is not used (workload/compiled_programs.py), so every host of the
    # restart compiles its programs again; the run loses nothing else. One restart is all it needs:
    # 20 steps, a kill at step 10 (the restore of step 5 checked like every other). Two hosts, a
    # slice each (twins still), as the check is per host: every compile here is a cold one, twice.
    cache = tmp_path / "open-cache"
    (cache / "executables").mkdir(parents=True)
    (cache / "executables").chmod(0o777)
    monkeypatch.setenv("SLICEKEEPER_COMPILATION_CACHE", str(cache))
    report = run_example(
        tmp_path / "run", "--chaos", "kill:host=1@step=10", steps=SHORT_STEPS, local={"hosts": 2}
    )
    found = problems(report, hosts_per_slice=1, steps=SHORT_STEPS)
    # Said twice per host: by the cache's own lists, and by JAX's compile events (independent of them).
    assert [f for f in found if "framework compiled" not in f] == [
        f"generation 1: host {h} compiled ['gather', 'local_grads', 'apply'] again (world [0, 1] ran before)"
        for h in range(2)
    ]
    assert [f.split("'s framework compiled")[0] for f in found if "framework compiled" in f] == [
        f"generation 1: host {h}" for h in range(2)
    ]
