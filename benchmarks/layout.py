"""Benchmark of the reference job's state layout: step time and checkpoint size, split vs replicated.

The reference trainer splits its state over the hosts of a slice (`fsdp`) and replicates it over
slices. With one host per slice it degenerates into the layout it used to have: every host holds the
whole model (split only over its own devices). This benchmark runs both, side by side and in
alternation (so that a busy machine slows both alike), fault-free, on the same four host processes:

- `split`: the example job, 2 slices x 2 hosts (v5p-16): each host holds half of the state;
- `replicated`: the same job as 4 slices x 1 host (v5p-8): each host holds all of it;
- `before` (with `--before CHECKOUT`): the example job run by another checkout of slicekeeper, with
  its own `make install` done (its `.venv/bin/slicekeeper`): the code as it was before a change.

Per run it reads the hosts' event logs: the median step time (step_begin -> step_end, the first
step of each start left out), the median blocking part of a checkpoint save, and the bytes of one
host's shard of a checkpoint (the `replicated` records of its peer copies). The table shows the
median and range over `--rounds` runs of each layout.

    .venv/bin/python benchmarks/layout.py [--rounds 2] [--steps 100] [--json figures.json]
        [--before CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml
from harness import (
    DEFAULT_JOB,
    RunFailed,
    checkpoint_save_seconds,
    finish,
    read_events,
    read_run_report,
    run_once,
    say,
    slicekeeper_command,
    step_durations,
)

LAYOUTS = {
    "split": {"tpu": {"type": "v5p-16"}, "slices": 2},
    "replicated": {"tpu": {"type": "v5p-8"}, "slices": 4},
    "before": {"tpu": {"type": "v5p-16"}, "slices": 2},
}
"""Each runs 4 host processes of 2 CPU devices; only how the state is laid out over them differs
(`before`: however the other checkout laid it out)."""


@dataclass
class LayoutRun:
    layout: str
    round: int
    median_step_seconds: float
    median_save_stall_seconds: float
    shard_bytes_per_host: int
    wall_seconds: float


def write_job(layout: str, path: Path) -> None:
    document = yaml.safe_load(DEFAULT_JOB.read_text())
    document["spec"].update(LAYOUTS[layout])
    document["spec"]["checkpoint"]["persistent"] = None
    document["spec"]["local"]["spares"] = 0
    path.write_text(yaml.safe_dump(document))


def measure(
    layout: str, round_: int, steps: int, work: Path, timeout: float, before: Path | None
) -> LayoutRun:
    folder = work / f"{layout}-{round_}"
    folder.mkdir(parents=True)
    job, report_path = folder / "job.yaml", folder / "report.json"
    write_job(layout, job)
    command = [str(before / ".venv" / "bin" / "slicekeeper")] if layout == "before" and before else None
    argv = [*(command or slicekeeper_command()), "run", str(job), "--steps", str(steps)]
    argv += ["--report", str(report_path)]
    status, seconds, timed_out = run_once(argv, folder / "run.log", timeout, f"{layout} {round_}: ")
    report = read_run_report(report_path, status, timed_out, timeout)
    if report["state"] != "succeeded":
        raise RunFailed(f"{layout} round {round_}: {report['state']}: {report.get('failure_reason')}")
    run_dir = Path(report["run_dir"])
    events = {h: read_events(run_dir / f"host-{h}" / "events.jsonl") for h in range(4)}
    steps_seconds = [d for host_events in events.values() for d in step_durations(host_events)]
    stalls = [s for host_events in events.values() for s in checkpoint_save_seconds(host_events)]
    shard_bytes = [int(e["bytes"]) for e in events[0] if e.get("type") == "replicated"]
    if not steps_seconds or not shard_bytes:
        raise RunFailed(f"{layout} round {round_}: no steps or no replicated checkpoint in {run_dir}")
    return LayoutRun(
        layout,
        round_,
        statistics.median(steps_seconds),
        statistics.median(stalls) if stalls else 0.0,
        int(statistics.median(shard_bytes)),
        seconds,
    )


def table(runs: list[LayoutRun]) -> str:
    lines = [
        f"{'layout':<12}{'step time (ms)':>26}{'save stall (ms)':>22}{'shard per host (KiB)':>24}",
    ]
    for layout in LAYOUTS:
        mine = [r for r in runs if r.layout == layout]
        if not mine:
            continue

        def cell(values: list[float], digits: int = 0) -> str:
            low, mid, high = min(values), statistics.median(values), max(values)
            return f"{mid:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"

        lines.append(
            f"{layout:<12}"
            f"{cell([r.median_step_seconds * 1000 for r in mine]):>26}"
            f"{cell([r.median_save_stall_seconds * 1000 for r in mine], 1):>22}"
            f"{statistics.median([r.shard_bytes_per_host for r in mine]) / 1024:>24.0f}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="runs of each layout, alternating")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the runs' folders")
    parser.add_argument(
        "--before",
        type=Path,
        metavar="CHECKOUT",
        help="also run the example job with this checkout's slicekeeper (made with its `make install`)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    layouts = [name for name in LAYOUTS if name != "before" or args.before is not None]
    if args.before is not None and not (args.before / ".venv" / "bin" / "slicekeeper").exists():
        say(f"--before {args.before}: no .venv/bin/slicekeeper there (run `make install` in it)")
        return 2
    work = Path(tempfile.mkdtemp(prefix="slicekeeper-layout-bench-"))
    say(f"layout benchmark: {args.rounds} round(s) x {layouts}, {args.steps} steps each, in {work}")
    runs: list[LayoutRun] = []
    failures: list[str] = []
    started = time.time()
    for round_ in range(1, args.rounds + 1):
        for layout in layouts:
            try:
                run = measure(layout, round_, args.steps, work, args.timeout, args.before)
            except RunFailed as error:
                failures.append(str(error))
                continue
            runs.append(run)
            say(
                f"  {layout} round {round_}: step {run.median_step_seconds * 1000:.0f} ms, save stall "
                f"{run.median_save_stall_seconds * 1000:.1f} ms, {run.shard_bytes_per_host} bytes per host"
            )
    say("")
    say(table(runs))
    say(f"({platform.node()}, {time.strftime('%Y-%m-%d %H:%M', time.gmtime(started))} UTC)")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1))
    return finish(failures, work, args.keep)


if __name__ == "__main__":
    sys.exit(main())
