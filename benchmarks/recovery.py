"""Benchmark of in-job restart: fault detection latency, recovery time, checkpoint save stall.

What it measures, over `--runs` local runs of the example TrainingJob (4 host processes, CPU devices),
each started as `slicekeeper run JOB --steps N --chaos "kill:host=2@step=40,hang:host=0@step=80"
--report PATH` in a subprocess. One run carries both faults, one after the other:

- crash detection latency: the kill fired (the supervisor SIGKILLs its workload) -> the leader records
  the fault as detected (`faults[].detection_seconds` of the report, kind `kill`);
- hang detection latency: the hang fired (SIGSTOP) -> detected (`detection_seconds`, kind `hang`),
  next to the typical step time of that run, since the hang timeout is derived from it: the median
  duration of the steps (step_begin -> step_end in the hosts' events.jsonl, the first step of every
  start left out, since it includes compilation);
- recovery time of the in-job restart, per fault: detection -> first step completed after the restart
  (`resumed_at - detected_at`) and detection -> first step completed beyond the job's pre-fault
  high-water mark (`productive_at - detected_at`), i.e. including the steps executed again;
- checkpoint save stall: per host, the time from each `phase` event with phase `checkpoint_save` to the
  next `phase` event in host-N/events.jsonl (the blocking part of a save; the write itself runs in
  the background), divided by the host's completed steps; the mean over hosts, as seconds per step and
  as a share of the typical step time. Also the report's `checkpoint_save` badput (mean over hosts).

Targets: crash detected in < 1 s; hang detected within 3 x typical step time + 2 s (the hang timeout is
max(2 s, 3 x typical step) by default); productive again < 10 s after detection (the resumed figure is
reported against the same bound). A target is met when every run meets it. The table shows the
median, min and max over runs. A run fails (exit status 1, after the remaining runs) when
`slicekeeper run` fails or times out, or a fault was not detected or not recovered from.

    .venv/bin/python benchmarks/recovery.py [--runs 3] [--steps 120] [--json figures.json]
        [--framework jax|torch|both]

`--framework` picks the example job: the JAX trainer (examples/trainingjob.yaml, the default) or the
PyTorch one (examples/trainingjob-torch.yaml); `both` measures the two in the same invocation, JAX's
runs first, and prints how the PyTorch job's recovery (detected -> productive) compares with JAX's
(target: within 20 %). The PyTorch job steps about three times as fast, so the same fault steps land
three times as early in its run: `both` measures it twice, at the same steps, and at the same time
into the run (`torch-timed`: the fault steps and the run's length scaled by the ratio of the two
jobs' typical step times), and compares both ways. Where they differ, the breakdown says why (a
fault that lands before the next standby process has finished its imports waits for them: `launch`).

Runs, event logs and the table are read and written with benchmarks/harness.py, as the other
benchmarks do.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness import (
    FRAMEWORK_JOBS,
    Row,
    RunFailed,
    breakdown_table,
    checkpoint_save_seconds,
    finish,
    format_table,
    measure_runs,
    read_events,
    say,
    slicekeeper_command,
    step_durations,
)

from slicekeeper.chaos import Fault, parse_chaos

DEFAULT_CHAOS = "kill:host=2@step=40,hang:host=0@step=80"

CRASH_TARGET_SECONDS = 1.0
HANG_TARGET_FACTOR = 3.0
HANG_TARGET_SLACK_SECONDS = 2.0
RECOVERY_TARGET_SECONDS = 10.0
CRASH_PRODUCTIVE_TARGET_SECONDS = 3.5
"""Issue 18: a crash, detected -> productive."""
HANG_PRODUCTIVE_TARGET_SECONDS = 5.5
"""Issue 18: a hang, from the fault (its detection included) -> productive."""
PROGRAMS_TARGET_SECONDS = 1.0
"""Issue 18: `program_startup` of a restart, on every host."""
TORCH_WITHIN = 0.20
"""The PyTorch job's recovery may take at most this much longer than the JAX job's (medians)."""


# --- figures of one run -----------------------------------------------------------------------------
@dataclass
class FaultFigures:
    kind: str
    host: int
    step: int
    detected_as: str | None
    detection_seconds: float
    resumed_seconds: float
    """Detection -> first step completed after the restart."""
    productive_seconds: float
    """Detection -> first step completed beyond the pre-fault high-water mark."""
    fired_to_productive_seconds: float
    breakdown: dict[str, Any] | None
    """The report's per-host breakdown of this recovery (slicekeeper.recovery_breakdown)."""

    def slowest(self, part: str) -> float | None:
        slowest = (self.breakdown or {}).get("slowest", {}).get(part)
        return None if slowest is None else float(slowest["seconds"])


@dataclass
class CheckpointFigures:
    saves: int
    """checkpoint_save phases closed, over all hosts."""
    save_seconds_mean: float
    """Mean duration of one checkpoint_save phase."""
    stall_seconds_per_step: float
    """Mean over hosts of (time in checkpoint_save) / (steps the host completed)."""
    badput_seconds: float
    """The report's checkpoint_save badput (mean over hosts)."""


@dataclass
class RunFigures:
    run: int
    wall_seconds: float
    goodput: float
    typical_step_seconds: float
    ideal_step_seconds: float | None
    faults: list[FaultFigures]
    checkpoint: CheckpointFigures
    cpu_user_per_step: float | None
    """The trainers' user CPU seconds per host-step (executed-again steps counted; standbys' too)."""
    cpu_system_per_step: float | None
    run_dir: str

    def fault(self, kind: str) -> FaultFigures:
        for figures in self.faults:
            if figures.kind == kind:
                return figures
        raise KeyError(kind)


# --- reading a run's artifacts ----------------------------------------------------------------------
def completed_steps(events: list[dict[str, Any]]) -> int:
    """Steps this host completed, executed-again ones included (they paid for their saves, too)."""
    return sum(1 for e in events if e.get("source") == "workload" and e["type"] == "step_end")


def analyse(run: int, report: dict[str, Any]) -> RunFigures:
    """The figures of one run from its report and its hosts' event logs; RunFailed if unusable."""
    if report.get("state") != "succeeded":
        raise RunFailed(f"job {report.get('state')}: {report.get('failure_reason')}")
    run_dir = Path(report["run_dir"])
    host_events = [read_events(path) for path in sorted(run_dir.glob("host-*/events.jsonl"))]
    if not host_events:
        raise RunFailed(f"no host-*/events.jsonl under {run_dir}")

    durations = [d for events in host_events for d in step_durations(events)]
    if not durations:
        raise RunFailed("no completed steps in the event logs")
    typical = statistics.median(durations)

    faults = []
    for fault in report["faults"]:
        where = f"fault {fault['kind']} host {fault['host']} @ step {fault['step']}"
        for key in ("detected_at", "resumed_at", "productive_at"):
            if fault.get(key) is None:
                raise RunFailed(f"{where}: no {key} in the report")
        faults.append(
            FaultFigures(
                kind=fault["kind"],
                host=int(fault["host"]),
                step=int(fault["step"]),
                detected_as=fault.get("detected_as"),
                detection_seconds=float(fault["detected_at"]) - float(fault["fired_at"]),
                resumed_seconds=float(fault["resumed_at"]) - float(fault["detected_at"]),
                productive_seconds=float(fault["productive_at"]) - float(fault["detected_at"]),
                fired_to_productive_seconds=float(fault["productive_at"]) - float(fault["fired_at"]),
                breakdown=fault.get("breakdown"),
            )
        )
    kinds = sorted(f.kind for f in faults)
    if kinds != ["hang", "kill"]:
        raise RunFailed(f"expected one kill and one hang in the report, found {kinds or 'none'}")

    saves = [s for events in host_events for s in checkpoint_save_seconds(events)]
    per_step = [
        sum(checkpoint_save_seconds(events)) / steps
        for events in host_events
        if (steps := completed_steps(events)) > 0
    ]
    checkpoint = CheckpointFigures(
        saves=len(saves),
        save_seconds_mean=statistics.fmean(saves) if saves else 0.0,
        stall_seconds_per_step=statistics.fmean(per_step) if per_step else 0.0,
        badput_seconds=float(report["badput_seconds"].get("checkpoint_save", 0.0)),
    )
    host_steps = sum(completed_steps(events) for events in host_events)
    cpu = report.get("trainer_cpu_seconds") or {}
    return RunFigures(
        run=run,
        wall_seconds=float(report["wall_seconds"]),
        goodput=float(report["goodput"]),
        typical_step_seconds=typical,
        ideal_step_seconds=report.get("ideal_step_seconds"),
        faults=faults,
        checkpoint=checkpoint,
        cpu_user_per_step=cpu["user"] / host_steps if cpu and host_steps else None,
        cpu_system_per_step=cpu["system"] / host_steps if cpu and host_steps else None,
        run_dir=str(run_dir),
    )


# --- the table --------------------------------------------------------------------------------------
def build_rows(runs: list[RunFigures]) -> list[Row]:
    typical = [r.typical_step_seconds for r in runs]
    crash = [r.fault("kill").detection_seconds for r in runs]
    hang = [r.fault("hang").detection_seconds for r in runs]
    hang_limits = [HANG_TARGET_FACTOR * t + HANG_TARGET_SLACK_SECONDS for t in typical]
    rows = [
        Row("typical step time", typical, "s"),
        Row(
            "crash detection (kill -> detected)",
            crash,
            "s",
            f"< {CRASH_TARGET_SECONDS:g} s",
            [c < CRASH_TARGET_SECONDS for c in crash],
        ),
        Row(
            "hang detection (hang -> detected)",
            hang,
            "s",
            f"< 3 x step + 2 s (= {statistics.median(hang_limits):.2f} s)",
            [h < limit for h, limit in zip(hang, hang_limits, strict=True)],
        ),
    ]
    for kind, name in (("kill", "crash"), ("hang", "hang")):
        resumed = [r.fault(kind).resumed_seconds for r in runs]
        productive = [r.fault(kind).productive_seconds for r in runs]
        rows.append(
            Row(
                f"{name} recovery: detected -> resumed",
                resumed,
                "s",
                f"< {RECOVERY_TARGET_SECONDS:g} s",
                [v < RECOVERY_TARGET_SECONDS for v in resumed],
            )
        )
        if kind == "kill":
            rows.append(
                Row(
                    f"{name} recovery: detected -> productive",
                    productive,
                    "s",
                    f"<= {CRASH_PRODUCTIVE_TARGET_SECONDS:g} s",
                    [v <= CRASH_PRODUCTIVE_TARGET_SECONDS for v in productive],
                )
            )
        else:
            rows.append(Row(f"{name} recovery: detected -> productive", productive, "s"))
            whole = [r.fault(kind).fired_to_productive_seconds for r in runs]
            rows.append(
                Row(
                    f"{name} recovery: hang -> productive",
                    whole,
                    "s",
                    f"<= {HANG_PRODUCTIVE_TARGET_SECONDS:g} s",
                    [v <= HANG_PRODUCTIVE_TARGET_SECONDS for v in whole],
                )
            )
        programs = [r.fault(kind).slowest("programs") for r in runs]
        if all(p is not None for p in programs):
            rows.append(
                Row(
                    f"{name} restart: programs, slowest host",
                    [float(p or 0.0) for p in programs],
                    "s",
                    f"<= {PROGRAMS_TARGET_SECONDS:g} s",
                    [float(p or 0.0) <= PROGRAMS_TARGET_SECONDS for p in programs],
                )
            )
    stall = [r.checkpoint.stall_seconds_per_step for r in runs]
    rows += [
        Row("checkpoint save phase (per save)", [r.checkpoint.save_seconds_mean for r in runs], "s"),
        Row("checkpoint save stall per step", [s * 1000 for s in stall], "ms"),
        Row(
            "checkpoint save stall / step time",
            [100 * s / t for s, t in zip(stall, typical, strict=True)],
            "%",
        ),
        Row("checkpoint_save badput (report)", [r.checkpoint.badput_seconds for r in runs], "s"),
        Row("goodput (report)", [r.goodput for r in runs], ""),
    ]
    user = [r.cpu_user_per_step for r in runs]
    system = [r.cpu_system_per_step for r in runs]
    if all(u is not None for u in user) and all(v is not None for v in system):
        rows += [
            Row("trainers' user CPU per host-step", [1000 * float(u or 0) for u in user], "ms"),
            Row(
                "trainers' system CPU per host-step",
                [1000 * float(v or 0) for v in system],
                "ms",
                "<= user CPU",
                [float(v or 0) <= float(u or 0) for u, v in zip(user, system, strict=True)],
            ),
        ]
    rows += [
        Row("wall time per run", [r.wall_seconds for r in runs], "s"),
    ]
    return rows


# --- entry ------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Measure fault detection, in-job restart recovery and checkpoint stall (local mode)."
    )
    parser.add_argument("--runs", type=int, default=3, help="runs to measure (default 3)")
    parser.add_argument("--steps", type=int, default=120, help="training steps per run (default 120)")
    parser.add_argument("--job", type=Path, help="TrainingJob YAML (default: the example of --framework)")
    parser.add_argument(
        "--framework",
        choices=("jax", "torch", "both"),
        default="jax",
        help="the example job's trainer; both: the two, compared (default jax)",
    )
    parser.add_argument(
        "--chaos",
        default=DEFAULT_CHAOS,
        help=f"faults per run: one kill and one hang (default '{DEFAULT_CHAOS}')",
    )
    parser.add_argument("--json", type=Path, help="write the raw figures of every run and the summary here")
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds before a run is stopped (default 600)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep every run's directory and log (default: only failed runs')"
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.steps < 1:
        parser.error("--runs and --steps must be at least 1")
    if args.job is not None and args.framework == "both":
        parser.error("--job names one job: it cannot be measured as both frameworks")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="slicekeeper-bench-"))
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    machine = f"{platform.node()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"
    frameworks = ["jax", "torch"] if args.framework == "both" else [args.framework]
    say(f"recovery benchmark: {args.runs} run(s) of {args.steps} steps per job, chaos '{args.chaos}'")
    say(f"  started {started_at} on {machine}; load average {os.getloadavg()[0]:.2f}; work dir {work}")

    def describe(run: RunFigures) -> str:
        kill, hang = run.fault("kill"), run.fault("hang")
        return (
            f"step {run.typical_step_seconds * 1000:.0f} ms; "
            f"crash detected in {kill.detection_seconds:.2f} s, productive {kill.productive_seconds:.2f} s "
            f"later; hang detected in {hang.detection_seconds:.2f} s, productive "
            f"{hang.productive_seconds:.2f} s later"
        )

    failures: list[str] = []
    keep = args.keep
    results: dict[str, dict[str, Any]] = {}
    plans = [(framework, framework, args.steps, args.chaos) for framework in frameworks]
    if args.framework == "both":
        plans.append(("torch-timed", "torch", args.steps, args.chaos))  # scaled once JAX and torch ran
    for name, framework, steps, chaos in plans:
        if name == "torch-timed":
            ratio = time_ratio(results)
            if ratio is None:
                continue
            steps, chaos = round(args.steps * ratio), scaled_chaos(args.chaos, ratio)
            say(f"torch at the same time into the run: x{ratio:.2f} the steps, chaos '{chaos}'")
        job = args.job or FRAMEWORK_JOBS[framework]
        folder = work / name
        folder.mkdir()
        say(f"{name}: {job}")

        def command(report_path: Path, job: Path = job, steps: int = steps, chaos: str = chaos) -> list[str]:
            return [
                *slicekeeper_command(),
                "run",
                str(job),
                "--steps",
                str(steps),
                "--chaos",
                chaos,
                "--report",
                str(report_path),
            ]

        measured = measure_runs(
            args.runs, command, analyse, work=folder, timeout=args.timeout, keep=args.keep, describe=describe
        )
        failures += [f"{name} {failure}" for failure in measured.failures]
        keep = keep or measured.keep
        rows = build_rows(measured.figures) if measured.figures else []
        if rows:
            say("")
            say(f"{name}: {len(measured.figures)} of {args.runs} run(s), {steps} steps each; median/min/max")
            say(format_table(rows, len(measured.figures)))
            say("")
            for run in measured.figures:
                for fault in run.faults:
                    where = f"run {run.run}, {fault.kind} on host {fault.host} @ step {fault.step}"
                    for line in breakdown_table(where, fault.breakdown):
                        say(line)
            say("")
        results[name] = {
            "job": str(job),
            "steps": steps,
            "chaos": chaos,
            "failures": measured.failures,
            "summary": [row.summary() for row in rows],
            "runs": [asdict(f) for f in measured.figures],
            "figures": measured.figures,
        }
    comparison = compare(results) if "jax" in results and "torch" in results else []
    for line in comparison:
        say(line)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "started_at": started_at,
                    "machine": machine,
                    "cpu_count": os.cpu_count(),
                    "runs_requested": args.runs,
                    "steps": args.steps,
                    "chaos": args.chaos,
                    "failures": failures,
                    "frameworks": {
                        name: {k: v for k, v in result.items() if k != "figures"}
                        for name, result in results.items()
                    },
                    "comparison": comparison,
                },
                indent=1,
            )
        )
        say(f"raw figures: {args.json}")
    return finish(failures, work, keep)


def time_ratio(results: dict[str, dict[str, Any]]) -> float | None:
    """JAX's median typical step time over PyTorch's (from their runs so far); None without both."""
    jax_runs, torch_runs = results["jax"]["figures"], results["torch"]["figures"]
    if not jax_runs or not torch_runs:
        return None
    jax_step = statistics.median(r.typical_step_seconds for r in jax_runs)
    return jax_step / statistics.median(r.typical_step_seconds for r in torch_runs)


def scaled_chaos(spec: str, ratio: float) -> str:
    """`spec` with every fault's step multiplied by `ratio` (rounded)."""
    return ",".join(
        str(Fault(fault.kind, max(1, round(fault.step * ratio)), fault.args)) for fault in parse_chaos(spec)
    )


def compare(results: dict[str, dict[str, Any]]) -> list[str]:
    """How the PyTorch job's recovery compares with the JAX job's: medians of detected -> productive,
    with the faults at the same steps and, when measured, at the same time into the run."""
    jax_runs = results["jax"]["figures"]
    lines = [
        f"PyTorch against JAX (median detected -> productive; target: at most {TORCH_WITHIN:.0%} longer)"
    ]
    for name, what in (("torch", "at the same steps"), ("torch-timed", "at the same time into the run")):
        torch_runs = results.get(name, {}).get("figures")
        if not jax_runs or not torch_runs:
            lines.append(f"  {what}: no comparison (a job has no successful run)")
            continue
        for kind, fault in (("kill", "crash"), ("hang", "hang")):
            jax_median = statistics.median(r.fault(kind).productive_seconds for r in jax_runs)
            torch_median = statistics.median(r.fault(kind).productive_seconds for r in torch_runs)
            ratio = torch_median / jax_median
            verdict = "met" if ratio <= 1 + TORCH_WITHIN else "NOT met"
            lines.append(
                f"  {what}, {fault}: torch {torch_median:.2f} s, jax {jax_median:.2f} s, "
                f"ratio {ratio:.2f}: {verdict}"
            )
    return lines


if __name__ == "__main__":
    sys.exit(main())
