"""Runs of the example TrainingJob (the reference JAX trainer, two slices of two hosts) that the chaos
tests and the cluster tests compare with one another, and the fault-free run they are measured
against (`clean_run`, a session fixture in tests/conftest.py: run once, shared)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.support.cli_runs import read_report, run_cli, write_job

STEPS = 70
"""Steps of every acceptance run: checkpoints every 5 steps, a persistent one every 30. Each fault of
a run needs a few steps before it and the next (a restart replays at most 4 steps, a straggler is
found within about 15 steps of a 2x slowdown): 70 leave room for three, at about 0.2 s a step."""
PERSISTENT_INTERVAL = 30
DEVICES_PER_HOST = 1
"""CPU devices of each host in the suite's runs of the example job (the example itself has 2, as
`make demo` runs it). With two, each step's local work is 53 collectives between a host's devices
(the `model` axis: XLA's in-process rendezvous, a storm of futex calls), most of a step's CPU;
with one, none. A clean run of 70 steps: 26 s of CPU against 42 (`/usr/bin/time`, the suite's
compile flags, programs cached, the machine loaded). What two devices a host add is checked where
it is the subject: the model's layout and collectives (tests/unit/test_reference_elastic.py), and
one acceptance run with a fault-free run of its own (tests/chaos/test_jax_recovery.py). The
operator's JAX pods have as many (tests/operator/)."""


def example_job(where: Path, persistent_interval: int = PERSISTENT_INTERVAL, **spec: Any) -> Path:
    """The example TrainingJob, its persistent tier in `where/persistent` (a step every
    `persistent_interval`), its final parameters written to `where/params.npz`; `spec` changes merged
    one level deep."""
    where.mkdir(parents=True, exist_ok=True)
    persistent = {"uri": str(where / "persistent"), "interval": persistent_interval, "maxToKeep": 2}
    changes: dict[str, Any] = {
        "workload": {"args": ["--seed", "0", "--final-params", str(where / "params.npz")]},
        "checkpoint": {"persistent": persistent},
        "local": {"devicesPerHost": DEVICES_PER_HOST},
    }
    for key, value in spec.items():
        changes[key] = {**changes[key], **value} if isinstance(changes.get(key), dict) else value
    return write_job(where / "job.yaml", **changes)


def run_example(
    where: Path, *extra: str, steps: int = STEPS, persistent_interval: int = PERSISTENT_INTERVAL, **spec: Any
) -> dict[str, Any]:
    """`slicekeeper run` of the example job in `where` with `extra` arguments: its report, with the
    CLI's exit code, stdout and stderr."""
    report_path = where / "report.json"
    job = example_job(where, persistent_interval, **spec)
    result = run_cli(
        "run", str(job), "--steps", str(steps), "--report", str(report_path), *extra, timeout=900
    )
    assert report_path.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    report = read_report(report_path)
    report["exit_code"], report["stdout"], report["stderr"] = result.returncode, result.stdout, result.stderr
    return report


def final_params(where: Path) -> dict[str, np.ndarray]:
    with np.load(where / "params.npz") as saved:
        return {name: saved[name] for name in saved.files}


def persistent_step(where: Path, step: int) -> Path:
    """The folder of a committed persistent step of the run in `where` (one run per folder)."""
    [folder] = (where / "persistent").glob(f"**/step-{step:08d}")
    assert (folder / "COMMITTED").exists(), folder
    return folder


def clean_run(where: Path, devices_per_host: int = DEVICES_PER_HOST) -> dict[str, Any]:
    """The fault-free run: its report, final parameters and the folder it ran in. With no standby
    process: nothing restarts, and the standbys a run pre-starts after its first step would only cost
    their imports (3 s of a 23 s run here)."""
    report = run_example(where, workload={"standby": False}, local={"devicesPerHost": devices_per_host})
    assert report["exit_code"] == 0, report["stderr"][-3000:]
    assert report["restarts"] == {} and report["faults"] == [] and report["recoveries"] == []
    assert report["stragglers"] == [] and report["decisions"] == []
    assert report["params_fingerprint"] and not report["params_fingerprint"].startswith("diverged")
    return {"report": report, "params": final_params(where), "where": where}
