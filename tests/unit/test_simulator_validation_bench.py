"""benchmarks/simulator_validation.py's small correctness check (its runs take minutes: out of the
suite): the jobs it runs, and a replay of reports already kept refuses to invent missing ones."""

from __future__ import annotations

import sys

import yaml

from benchmarks import simulator_validation as bench


def test_the_sdk_mixes_run_the_sdk_loop_with_its_spares_and_the_jax_ones_the_example(tmp_path):
    sdk = next(m for m in bench.MIXES if m.name == "sdk elastic")
    job = yaml.safe_load(bench.job_file(sdk, tmp_path).read_text())
    assert job["spec"]["workload"]["command"] == [
        sys.executable,
        str(bench.REPO / "examples" / "sdk_loop.py"),
    ]
    assert job["spec"]["local"]["spares"] == 1 and job["spec"]["checkpoint"]["interval"] == 5
    jax = next(m for m in bench.MIXES if m.workload == "jax")
    assert "sdk_loop" not in str(
        yaml.safe_load(bench.job_file(jax, tmp_path).read_text())["spec"]["workload"]
    )
    assert {m.costs_from for m in bench.MIXES} <= {m.name for m in bench.MIXES}  # every source is run


def test_replay_only_without_the_reports_says_so_and_fails(tmp_path, capsys):
    assert bench.main(["--work", str(tmp_path), "--replay-only", "--only", "sdk"]) == 1
    said = capsys.readouterr()
    assert "run without --replay-only first" in said.out + said.err
