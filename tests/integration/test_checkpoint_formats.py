"""A job's checkpoints leave slicekeeper in the formats users' tools read, and a job starts from one.

For each reference trainer (JAX: orbax; PyTorch: torch.distributed.checkpoint), one run of the
example job (2 slices x 2 hosts, 30 steps, every 10th step saved and persisted) is exported with
`slicekeeper checkpoint export`. Its newest step is loaded by the plain library in a fresh process
(tests/fixtures/exported_checkpoints.py, no slicekeeper code) and must equal the trainer's own final
parameters; an older step starts a job laid out differently (1 slice x 4 hosts: every array
resharded), whose first step must be the next one, with the exporting run's loss, and whose end
must be the exporting run's parameters. The negative control starts from the same step with the
optimizer's moments lost, and must end elsewhere.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from slicekeeper.supervisor.ports import free_port

from tests.support.cli_runs import ROOT, run_cli
from tests.support.example_runs import final_params, run_example

pytestmark = [pytest.mark.timeout(900), pytest.mark.heavy]

STEPS = 30
INTERVAL = 10
TORCH_TRAINER = yaml.safe_load((ROOT / "examples" / "trainingjob-torch.yaml").read_text())["spec"][
    "workload"
]["command"]
EXPORTED = [sys.executable, str(ROOT / "tests" / "fixtures" / "exported_checkpoints.py")]
RESHARDED = {"tpu": {"type": "v5p-32"}, "slices": 1}
"""One slice of 4 hosts where the exporting job had 2 of 2: each host's rows are new."""


def run(where: Path, framework: str, *extra: str, **spec: Any) -> dict[str, Any]:
    """The example job with `framework`'s trainer. No run here restarts: no standby process (each
    would only cost its framework's imports)."""
    workload: dict[str, Any] = {"command": TORCH_TRAINER} if framework == "torch" else {}
    workload["standby"] = False
    return run_example(
        where,
        *extra,
        steps=STEPS,
        persistent_interval=INTERVAL,
        workload=workload,
        checkpoint={"interval": INTERVAL},
        **spec,
    )


def step_losses(report: dict[str, Any]) -> dict[int, float]:
    """Host 0's loss at every step it ended, from its event log."""
    losses = {}
    for line in (Path(report["run_dir"]) / "host-0" / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("type") == "step_end":
            losses[int(event["step"])] = float(event["loss"])
    return losses


def export(run_dir: str, destination: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli("checkpoint", "export", run_dir, str(destination), *extra, timeout=300)


def plain_load(*args: str) -> None:
    result = subprocess.run([*EXPORTED, *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module", params=["jax", "torch"])
def exporting_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    framework = request.param
    where = tmp_path_factory.mktemp(f"exporting-{framework}")
    report = run(where, framework)
    assert report["exit_code"] == 0, report["stderr"][-3000:]
    return {"framework": framework, "report": report, "params": final_params(where), "where": where}


def test_list_shows_each_step_whole_with_its_copies_and_a_corrupt_one(exporting_run, tmp_path):
    listed = run_cli("checkpoint", "list", exporting_run["report"]["run_dir"])
    assert listed.returncode == 0, listed.stderr
    rows = [line for line in listed.stdout.splitlines() if line.strip().startswith("│")]
    assert [row.split("│")[1].strip() for row in rows] == ["20", "30"]
    for row in rows:
        assert (
            exporting_run["framework"] in row
            and "hosts 0,1,2,3" in row
            and "4 copies, checksums match" in row
        )
    # A copy of the persistent tier, listed at its location, with one host's step-30 file damaged.
    persistent = tmp_path / "persistent"
    shutil.copytree(exporting_run["where"] / "persistent", persistent)
    [location] = {folder.parent for folder in persistent.glob("*/*/step-*")}
    victim = next((location / "step-00000030" / "host-1").glob("*.npy"))
    victim.write_bytes(victim.read_bytes()[:-8] + b"\0" * 8)
    listed = run_cli("checkpoint", "list", str(location))
    assert listed.returncode == 0, listed.stderr
    assert "1 of 4 copies bad" in listed.stdout
    assert "the persistent copy of host-1" in listed.stdout and "checksum mismatch" in listed.stdout
    # Its twin (host 3) holds the same rows: step 30 is still whole and exports, without host 1's copy.
    exported = export(str(location), tmp_path / "from-twin")
    assert exported.returncode == 0, exported.stderr
    assert (
        "exported step 30" in exported.stdout and "skipping the persistent copy of host-1" in exported.stderr
    )
    # With the twin's copy damaged too, step 30 is not whole: asked for, it is refused by name.
    twin = location / "step-00000030" / "host-3" / victim.name
    twin.write_bytes(twin.read_bytes()[:-8] + b"\0" * 8)
    refused = export(str(location), tmp_path / "refused", "--step", "30")
    assert refused.returncode == 2 and "--step 30: not whole" in refused.stderr
    assert not (tmp_path / "refused").exists() and not list(tmp_path.glob("refused.partial*"))
    # Unasked, the export finds that out when it checks the newest step, and takes the one before.
    fallback = export(str(location), tmp_path / "fallback")
    assert fallback.returncode == 0 and "exported step 20" in fallback.stdout, fallback.stderr


def test_the_newest_step_loads_with_the_plain_library_in_a_fresh_process(exporting_run, tmp_path):
    exported = export(exporting_run["report"]["run_dir"], tmp_path / "exported")
    assert exported.returncode == 0, exported.stderr
    assert f"exported step {STEPS}" in exported.stdout
    final = exporting_run["params"]
    if exporting_run["framework"] == "jax":
        plain_load("load-orbax", str(tmp_path / "exported"), str(tmp_path / "loaded.npz"))
        with np.load(tmp_path / "loaded.npz") as loaded:
            assert int(loaded["step"]) == STEPS
            assert {name: loaded[f"params/{name}"] for name in final}.keys() == final.keys()
            for name, value in final.items():
                np.testing.assert_array_equal(loaded[f"params/{name}"], value, err_msg=name)
        return
    # DCP: into one process, and into two ranks each reading its rows (another world size).
    plain_load("load-dcp", str(tmp_path / "exported"), str(tmp_path / "whole.npz"))
    port = str(free_port())
    ranks = [
        subprocess.Popen(
            [
                *EXPORTED,
                "load-dcp",
                str(tmp_path / "exported"),
                str(tmp_path / f"rank{r}.npz"),
                str(r),
                "2",
                port,
            ]
        )
        for r in (0, 1)
    ]
    assert [rank.wait(timeout=300) for rank in ranks] == [0, 0]
    with (
        np.load(tmp_path / "whole.npz") as whole,
        np.load(tmp_path / "rank0.npz") as first,
        np.load(tmp_path / "rank1.npz") as second,
    ):
        assert int(whole["step"]) == int(first["step"]) == STEPS
        for name, value in final.items():
            np.testing.assert_array_equal(whole[f"model/{name}"], value, err_msg=name)
            halves = np.concatenate([first[f"model/{name}"], second[f"model/{name}"]])
            np.testing.assert_array_equal(halves, value, err_msg=f"{name}, read by two ranks")


def test_a_job_started_from_an_export_goes_on_where_it_left_off(exporting_run, tmp_path):
    """Resharded onto another layout, its first step is the next one, with the same loss, and it ends
    with the exporting run's parameters. Negative control: the same step without its optimizer state
    gives the same first loss (the parameters are right) and other parameters at the end."""
    framework, report = exporting_run["framework"], exporting_run["report"]
    exported = export(report["run_dir"], tmp_path / "step-20", "--step", "20")
    assert exported.returncode == 0, exported.stderr
    started = run(tmp_path / "started", framework, "--init-from", str(tmp_path / "step-20"), **RESHARDED)
    assert started["exit_code"] == 0, started["stderr"][-3000:]
    assert "1 slice(s) x 4 host(s)" in started["stdout"]
    losses, original = step_losses(started), step_losses(report)
    assert min(losses) == 21
    assert losses[21] == original[21]
    assert started["params_fingerprint"] == report["params_fingerprint"]

    plain_load("zero-moments", framework, str(tmp_path / "step-20"), str(tmp_path / "no-moments"))
    wrong = run(tmp_path / "wrong", framework, "--init-from", str(tmp_path / "no-moments"), **RESHARDED)
    assert wrong["exit_code"] == 0, wrong["stderr"][-3000:]
    assert step_losses(wrong)[21] == original[21]
    assert wrong["params_fingerprint"] != report["params_fingerprint"]


def test_a_start_from_a_checkpoint_that_is_not_there_is_refused_before_anything_runs(tmp_path):
    result = run_cli(
        "run", str(ROOT / "examples" / "trainingjob.yaml"), "--init-from", str(tmp_path / "nothing")
    )
    assert result.returncode == 2
    assert f"--init-from: {tmp_path / 'nothing'} is not a checkpoint directory" in result.stderr
