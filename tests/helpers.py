"""Helpers for tests that run `slicekeeper` as users do: a subprocess, files, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).parents[1]
EXAMPLE = ROOT / "examples" / "trainingjob.yaml"
SDK_LOOP = ROOT / "examples" / "sdk_loop.py"


def write_job(path: Path, **spec_changes: Any) -> Path:
    """The example TrainingJob with changes to `spec` (nested dicts are merged one level deep)."""
    document = yaml.safe_load(EXAMPLE.read_text())
    for key, value in spec_changes.items():
        if isinstance(value, dict) and isinstance(document["spec"].get(key), dict):
            document["spec"][key].update(value)
        else:
            document["spec"][key] = value
    path.write_text(yaml.safe_dump(document))
    return path


def sdk_loop_job(path: Path, steps: int = 40, **spec_changes: Any) -> Path:
    """A fast job: the numpy SDK example loop (50 ms steps) instead of the JAX trainer."""
    changes: dict[str, Any] = {
        "workload": {
            "command": [sys.executable, str(SDK_LOOP)],
            "args": [],
            "steps": steps,
            "standby": False,
        },
        # No spares and no persistent tier unless a test asks: nothing written outside tmp dirs.
        "checkpoint": {"interval": 5, "persistent": None},
        "local": {"spares": 0},
    }
    for key, value in spec_changes.items():
        if isinstance(value, dict) and isinstance(changes.get(key), dict):
            changes[key] = {**changes[key], **value}
        else:
            changes[key] = value
    return write_job(path, **changes)


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slicekeeper.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def run_job(
    tmp_path: Path, *extra: str, steps: int = 40, **spec: Any
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    """`slicekeeper run` of the SDK example loop job in `tmp_path`: the result and the report, if any."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    job = sdk_loop_job(tmp_path / "job.yaml", steps=steps, **spec)
    report_path = tmp_path / "report.json"
    result = run_cli("run", str(job), "--report", str(report_path), *extra)
    return result, read_report(report_path) if report_path.exists() else None


def read_report(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line or environment mentions `text` (e.g. a run directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            blob = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if text.encode() in blob and state != "Z":
            found.append(int(entry.name))
    return found
