"""Benchmark of the standard formats at the edges: `checkpoint list`, `checkpoint export`, `initFrom`.

For each reference trainer (`--framework jax|torch|both`), one run of its example job (4 host
processes, `--steps` steps, a persistent checkpoint every `--steps / 2` steps in a temp dir) makes
the checkpoints; then, `--runs` times each:

- `slicekeeper checkpoint list RUN` (every persistent copy downloaded and re-hashed): wall seconds;
- `slicekeeper checkpoint export RUN DEST` of the newest step: wall seconds of the command (Python
  start and imports included, as a user waits for it) and the seconds it reports for its own work;
- once: a job started from the export (`--init-from`, 5 more steps): the hosts' `checkpoint_restore`
  time (mean over hosts, from the report's badput), which is the load of the export resharded onto
  the job's mesh.

    .venv/bin/python benchmarks/export.py [--framework both] [--runs 3] [--steps 40]

Prints a table (median, min, max over runs). Fails (exit 1) when a command fails.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from harness import FRAMEWORK_JOBS, RunFailed, read_run_report, say, slicekeeper_command


def timed(argv: list[str], timeout: float = 600) -> tuple[float, str]:
    started = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    seconds = time.monotonic() - started
    if result.returncode != 0:
        raise RunFailed(f"{' '.join(argv)} exited {result.returncode}: {result.stderr[-2000:]}")
    return seconds, result.stdout


def job_file(framework: str, work: Path, steps: int) -> Path:
    document = yaml.safe_load(FRAMEWORK_JOBS[framework].read_text())
    checkpoint = document["spec"]["checkpoint"]
    checkpoint["persistent"] = {
        "uri": str(work / "persistent"),
        "interval": max(steps // 2, checkpoint["interval"]),
    }
    path = work / "job.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def run_job(job: Path, work: Path, name: str, *extra: str) -> dict[str, Any]:
    report = work / f"{name}.json"
    argv = [*slicekeeper_command(), "run", str(job), "--report", str(report), "--progress", "plain", *extra]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    return read_run_report(report, result.returncode, False, 900)


def measure(framework: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    work.mkdir(parents=True)
    job = job_file(framework, work, args.steps)
    say(f"{framework}: the run that makes the checkpoints ({args.steps} steps)")
    report = run_job(job, work, "source", "--steps", str(args.steps))
    run_dir = report["run_dir"]
    listing, wall, own = [], [], []
    size = ""
    for run in range(1, args.runs + 1):
        seconds, _ = timed([*slicekeeper_command(), "checkpoint", "list", run_dir])
        listing.append(seconds)
        destination = work / f"export-{run}"
        seconds, out = timed([*slicekeeper_command(), "checkpoint", "export", run_dir, str(destination)])
        wall.append(seconds)
        found = re.search(r": (\d+ arrays, [\d.]+ \w+), .*, in ([\d.]+) s", out)
        if found is None:
            raise RunFailed(f"export printed no summary: {out[-500:]}")
        size, work_seconds = found.group(1), float(found.group(2))
        own.append(work_seconds)
        say(
            f"  run {run}: list {listing[-1]:.2f} s, export {seconds:.2f} s "
            f"(its own work {work_seconds:.2f} s)"
        )
    started = run_job(
        job, work, "started", "--steps", str(args.steps + 5), "--init-from", str(work / "export-1")
    )
    hosts = len(started.get("hosts") or []) or 1
    restore = started["badput_seconds"]["checkpoint_restore"] / hosts
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(started["run_dir"], ignore_errors=True)
    return {"size": size, "list": listing, "export": wall, "export_own": own, "init_from_restore": restore}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} s  ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=["jax", "torch", "both"], default="both")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="slicekeeper-bench-export-"))
    frameworks = ["jax", "torch"] if args.framework == "both" else [args.framework]
    results = {}
    try:
        for framework in frameworks:
            results[framework] = measure(framework, args, work / framework)
    except (RunFailed, subprocess.TimeoutExpired, KeyError) as error:
        say(f"failed: {error}")
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say("")
    say(f"{args.runs} run(s) each; median (min-max)")
    for framework, figures in results.items():
        say(f"{framework}: the example's checkpoint, {figures['size']}")
        say(f"  checkpoint list (every copy re-hashed)  {spread(figures['list'])}")
        say(f"  checkpoint export, wall                  {spread(figures['export'])}")
        say(f"  checkpoint export, its own work          {spread(figures['export_own'])}")
        say(f"  initFrom load (checkpoint_restore/host)  {figures['init_from_restore']:6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
