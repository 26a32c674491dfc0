"""The CLI's policy parts: `slicekeeper policy replay`, and how `run` resolves and checks a policy file."""

from pathlib import Path

import pytest

from slicekeeper import api, cli
from slicekeeper.errors import UserError
from slicekeeper.policy import HostLost, World
from slicekeeper.policy.engine import PolicyEngine
from slicekeeper.policy.replay import append_to_log

ROOT = Path(__file__).parents[2]
EXAMPLE_JOB = ROOT / "examples" / "trainingjob.yaml"
NO_HOT_SWAP = ROOT / "examples" / "policies" / "no_hot_swap.py"


def a_log(tmp_path: Path) -> Path:
    log = tmp_path / "policy-events.jsonl"
    world = World(active_slices=(0, 1), full_slices=2, min_slices=1, hosts_per_slice=2, devices_per_host=2)
    engine = PolicyEngine()
    decision, context = engine.decide(
        HostLost(host=3, t=10.0, step=40, generation=1),
        now=10.5,
        step=40,
        generation=1,
        spares=1,
        scores={},
        world=world,
    )
    append_to_log(log, decision, context)
    return log


def test_policy_replay_prints_the_table_and_exits_0(tmp_path, capsys):
    assert cli.main(["policy", "replay", str(a_log(tmp_path)), "--policy", str(NO_HOT_SWAP)]) == 0
    out = capsys.readouterr().out
    assert "replayed (no_hot_swap.py)" in out
    assert "ReplaceHost(host=3) [default]" in out and "ScaleDown(slices=()) [user]" in out
    assert out.endswith("1 of 1 decision(s) differ\n")


def test_policy_replay_without_a_policy_replays_the_default(tmp_path, capsys):
    assert cli.main(["policy", "replay", str(a_log(tmp_path))]) == 0
    assert capsys.readouterr().out.endswith("0 of 1 decision(s) differ\n")


@pytest.mark.parametrize(
    ("policy_text", "log_text", "message"),
    [
        (None, None, "cannot read the event log"),
        ("def on_crash(event):\n    pass\n", "", "must take exactly two positional arguments"),
        (None, "garbage\n", "policy-events.jsonl:1: not valid JSON"),
    ],
)
def test_policy_replay_refuses_bad_files_with_exit_2(tmp_path, capsys, policy_text, log_text, message):
    log = tmp_path / "policy-events.jsonl"
    if log_text is not None:
        log.write_text(log_text)
    args = ["policy", "replay", str(log)]
    if policy_text is not None:
        (tmp_path / "p.py").write_text(policy_text)
        args += ["--policy", str(tmp_path / "p.py")]
    assert cli.main(args) == 2
    assert message in capsys.readouterr().err


def _job_with_policy_file(tmp_path: Path, file: str | None) -> tuple[api.TrainingJob, Path]:
    job = api.load_training_job(EXAMPLE_JOB)
    policy = job.spec.policy.model_copy(update={"file": file})
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"policy": policy})})
    job_file = tmp_path / "jobs" / "job.yaml"
    job_file.parent.mkdir()
    return job, job_file


def test_run_passes_the_policy_flag_on_as_an_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "mine.py").write_text(NO_HOT_SWAP.read_text())
    monkeypatch.chdir(tmp_path)
    job, job_file = _job_with_policy_file(tmp_path, "ignored.py")
    checked = cli._with_checked_policy(job, job_file=job_file, policy=Path("mine.py"))
    assert checked.spec.policy.file == str(tmp_path / "mine.py")
    assert checked.spec.policy.budgets == job.spec.policy.budgets


def test_run_reads_spec_policy_file_relative_to_the_job_file(tmp_path, monkeypatch):
    job, job_file = _job_with_policy_file(tmp_path, "policies/mine.py")
    (job_file.parent / "policies").mkdir()
    (job_file.parent / "policies" / "mine.py").write_text(NO_HOT_SWAP.read_text())
    monkeypatch.chdir(ROOT)
    checked = cli._with_checked_policy(job, job_file=job_file, policy=None)
    assert checked.spec.policy.file == str(job_file.parent / "policies" / "mine.py")


def test_an_inline_policy_source_becomes_a_checked_file_for_the_supervisors(tmp_path):
    job, job_file = _job_with_policy_file(tmp_path, None)
    policy = job.spec.policy.model_copy(update={"source": NO_HOT_SWAP.read_text()})
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"policy": policy})})
    checked = cli._with_checked_policy(job, job_file=job_file, policy=None)
    assert checked.spec.policy.source is None and checked.spec.policy.file is not None
    assert Path(checked.spec.policy.file).read_text() == NO_HOT_SWAP.read_text()

    broken = policy.model_copy(update={"source": "def on_crash(event):\n    return None\n"})
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"policy": broken})})
    with pytest.raises(UserError, match="on_crash"):
        cli._with_checked_policy(job, job_file=job_file, policy=None)


def test_run_without_a_policy_keeps_the_default(tmp_path):
    job, job_file = _job_with_policy_file(tmp_path, None)
    assert cli._with_checked_policy(job, job_file=job_file, policy=None).spec.policy.file is None


def test_run_checks_the_policy_before_anything_starts(tmp_path):
    job, job_file = _job_with_policy_file(tmp_path, "broken.py")
    (job_file.parent / "broken.py").write_text("def on_crash(event, context)\n")
    with pytest.raises(UserError, match=r"broken\.py:1: syntax error in the policy"):
        cli._with_checked_policy(job, job_file=job_file, policy=None)
