"""Bad input to `slicekeeper run`: a clear message naming the problem, exit 2, nothing started.

"Nothing started" is read from the run directory (`spec.local.workDir`): a run that got as far as
starting its supervisors has written its plan there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli_runs import EXAMPLE, run_cli, write_job


def started_runs(runs: Path) -> list[Path]:
    """Runs under `runs` that got as far as starting supervisors (a plan written for them)."""
    return list(runs.glob("*/plan.json"))


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"bogus": 1}, "spec.bogus: unknown field"),
        ({"slices": 0}, "spec.slices: Input should be greater than 0"),
        ({"slices": "two"}, "spec.slices: Input should be a valid integer"),
        ({"tpu": {"type": "v7z-8"}}, "spec.tpu: unknown TPU generation 'v7z'"),
        (
            {"tpu": {"type": "v5p-16", "topology": "4x4x4"}},
            "topology '4x4x4' has 64 chips, but type 'v5p-16' has 8",
        ),
        ({"workload": {"steps": -3}}, "spec.workload.steps: Input should be greater than 0"),
        ({"local": {"hosts": 3}}, "spec.local.hosts: 3 hosts do not split evenly over 2 slices"),
        ({"checkpoint": {"localDir": "/proc/forbidden"}}, "spec.checkpoint.localDir: '/proc/forbidden"),
    ],
)
def test_a_bad_job_file_is_refused_naming_the_field(tmp_path, changes, expected):
    runs = tmp_path / "runs"
    local = {**changes.get("local", {}), "workDir": str(runs)}
    job = write_job(tmp_path / "job.yaml", **{**changes, "local": local})
    result = run_cli("run", str(job), timeout=60)
    assert result.returncode == 2
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert started_runs(runs) == []


@pytest.mark.parametrize(
    ("chaos", "expected"),
    [
        ("kill:host=9@step=3", "names host 9, but the job has 4 hosts (0..3)"),
        (
            "melt:host=1@step=3",
            "unknown fault kind 'melt' (known: kill, hang, lose, corrupt, slow, crash-supervisor, "
            "partition, maintenance, preempt, spare)",
        ),
        ("kill:host=1", "missing '@step=S'"),
        ("kill:host=1@step=-1", "the trigger must be '@step=S'"),
    ],
)
def test_a_bad_chaos_spec_is_refused(chaos, expected):
    result = run_cli("run", str(EXAMPLE), "--chaos", chaos, timeout=60)
    assert result.returncode == 2
    assert expected in result.stderr


def test_an_unreadable_file_is_refused(tmp_path):
    result = run_cli("run", str(tmp_path / "nope.yaml"), timeout=60)
    assert result.returncode == 2
    assert "nope.yaml: cannot read the TrainingJob file" in result.stderr


def test_bad_flags_are_refused_by_the_parser():
    result = run_cli("run", str(EXAMPLE), "--steps", "0", timeout=60)
    assert result.returncode == 2
    assert "--steps: must be at least 1" in result.stderr


# --- policy files: checked before anything starts ------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("def on_crash(event, context)\n    return None\n", "policy.py:1: syntax error in the policy"),
        (
            "def on_crahs(event, context):\n    return None\n",
            "policy.py:1: unknown hook 'on_crahs' (did you mean on_crash?); known hooks: on_crash,",
        ),
        ("def handle(event, context):\n    return None\n", "policy.py: defines no policy hook"),
        (
            "def on_host_lost(event):\n    return None\n",
            "hook 'on_host_lost(event)' must take exactly two positional arguments",
        ),
    ],
    ids=["syntax-error", "misspelt-hook", "no-hook", "wrong-signature"],
)
def test_a_policy_that_cannot_work_is_refused_before_anything_starts(tmp_path, policy, expected):
    runs = tmp_path / "runs"
    job = write_job(tmp_path / "job.yaml", local={"workDir": str(runs)})
    (tmp_path / "policy.py").write_text(policy)
    result = run_cli("run", str(job), "--policy", str(tmp_path / "policy.py"), timeout=60)
    assert result.returncode == 2
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert not runs.exists()


def test_spec_policy_file_is_checked_relative_to_the_job_file(tmp_path):
    runs = tmp_path / "runs"
    job = write_job(tmp_path / "job.yaml", policy={"file": "policies/p.py"}, local={"workDir": str(runs)})
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.py").write_text("RATE = 1 / 0\n")
    result = run_cli("run", str(job), timeout=60)
    assert result.returncode == 2
    assert f"{tmp_path / 'policies' / 'p.py'}:1: the policy raised ZeroDivisionError" in result.stderr
    assert not runs.exists()


def test_a_missing_policy_file_is_refused(tmp_path):
    result = run_cli("run", str(EXAMPLE), "--policy", str(tmp_path / "nope.py"), timeout=60)
    assert result.returncode == 2
    assert "nope.py: cannot read the policy file" in result.stderr


def test_policy_replay_of_a_missing_log_is_refused(tmp_path):
    result = run_cli("policy", "replay", str(tmp_path / "nope.jsonl"), timeout=60)
    assert result.returncode == 2
    assert "nope.jsonl: cannot read the event log" in result.stderr
