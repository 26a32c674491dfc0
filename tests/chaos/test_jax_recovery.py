"""The acceptance run: the reference JAX job survives a kill and a hang with nothing lost."""

from __future__ import annotations

import pytest

from tests.helpers import EXAMPLE, processes_mentioning, read_report, run_cli

pytestmark = pytest.mark.slow

STEPS = "120"


def test_kill_and_hang_end_with_the_parameters_of_a_fault_free_run(tmp_path):
    clean = run_cli(
        "run", str(EXAMPLE), "--steps", STEPS, "--report", str(tmp_path / "clean.json"), timeout=900
    )
    assert clean.returncode == 0, clean.stderr
    faulty = run_cli(
        "run",
        str(EXAMPLE),
        "--steps",
        STEPS,
        "--chaos",
        "kill:host=2@step=40,hang:host=0@step=80",
        "--report",
        str(tmp_path / "faulty.json"),
        timeout=900,
    )
    assert faulty.returncode == 0, faulty.stderr
    clean_report, report = read_report(tmp_path / "clean.json"), read_report(tmp_path / "faulty.json")
    assert report["params_fingerprint"] == clean_report["params_fingerprint"] is not None
    assert report["steps_completed"] == 120
    assert report["restarts"] == {"crash": 1, "hang": 1}
    assert [(f["kind"], f["detected_as"]) for f in report["faults"]] == [("kill", "crash"), ("hang", "hang")]
    assert all(f["productive_at"] is not None for f in report["faults"])
    assert report["badput_seconds"]["wasted_progress"] > 0  # steps replayed after the restores
    assert clean_report["restarts"] == {} and clean_report["faults"] == []
    assert processes_mentioning(report["run_dir"]) == []
