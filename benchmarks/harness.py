"""What the benchmark scripts share: running `slicekeeper run`, reading what a run leaves, the table.

- running: `slicekeeper_command`, `run_once` (one run in a subprocess, its leader events echoed, stopped
  like a Ctrl-C on its time limit), `measure_runs` (a benchmark's runs, each analysed, failures
  collected), `read_run_report`, `finish` (the exit status; the work folder kept when a run
  failed), `tail`;
- a run's artifacts: its hosts' events.jsonl (`read_events`), their completed steps
  (`step_intervals`, `step_durations`) and checkpoint save phases (`checkpoint_save_seconds`);
- the table: `Row` (one metric over runs, with its target), `format_value`, `format_table`;
  `breakdown_table`, a fault's recovery per host and part.

A benchmark imports it as `harness` (`python benchmarks/<name>.py` puts this folder on sys.path):
recovery.py, handover.py, checkpoint.py, policy.py and layout.py, and the parts of checkpoint.py and
policy.py. It is a library, not a benchmark: it runs nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from slicekeeper.recovery_breakdown import LABELS, PARTS

REPO = Path(__file__).resolve().parent.parent
DEFAULT_JOB = REPO / "examples" / "trainingjob.yaml"
FRAMEWORK_JOBS = {"jax": DEFAULT_JOB, "torch": REPO / "examples" / "trainingjob-torch.yaml"}
"""The example job of each reference trainer."""
STOP_GRACE_SECONDS = 20.0
"""After a timeout or Ctrl-C: how long `slicekeeper run` gets to stop its hosts before being killed."""


class RunFailed(Exception):
    """A run that yields no usable figures (the job failed, timed out, or a fault went unhandled)."""


def say(text: str) -> None:
    print(text, flush=True)


# --- running ----------------------------------------------------------------------------------------
def slicekeeper_command() -> list[str]:
    """The `slicekeeper` console script of this interpreter's environment (or the module, failing that)."""
    script = Path(sys.executable).parent / "slicekeeper"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "slicekeeper.cli"]


def run_once(
    argv: list[str], log_path: Path, timeout: float, echo_prefix: str, env: dict[str, str] | None = None
) -> tuple[int, float, bool]:
    """Run one job; its output goes to log_path, leader events (`  [hh:mm:ss] ...`) are echoed; `env`:
    its environment (default: this process's).

    Returns (exit status, seconds, timed out). On timeout the run is interrupted like a Ctrl-C (it
    stops its hosts and writes its report), then, if still alive after a grace period, killed.
    """
    started = time.monotonic()
    with log_path.open("w") as log:
        process = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a Ctrl-C here reaches only us; we forward it (see below)
        )

        timed_out = threading.Event()

        def interrupt() -> None:
            timed_out.set()
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=STOP_GRACE_SECONDS)
            kill_group()

        def kill_group() -> None:
            if process.poll() is None:  # never signal a reaped (possibly reused) process id
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, interrupt)
        timer.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                log.write(line)
                if line.startswith("  ["):
                    say(echo_prefix + line.rstrip())
            status = process.wait()
        except KeyboardInterrupt:
            process.send_signal(signal.SIGINT)  # `slicekeeper run` stops its hosts on Ctrl-C
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=STOP_GRACE_SECONDS)
            kill_group()
            raise
        finally:
            timer.cancel()
    return status, time.monotonic() - started, timed_out.is_set()


class TrainerCpu(threading.Thread):
    """The trainers' user and system CPU seconds over one run, read from /proc every `interval`
    (the reference trainers' processes started after this began; a process's last interval before it
    is killed is missed). Standbys count: they are part of what a restart costs."""

    def __init__(self, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self._since = time.time()
        self._stop_event = threading.Event()
        self._ticks: dict[int, tuple[int, int]] = {}
        self._hz = os.sysconf("SC_CLK_TCK")

    def run(self) -> None:
        boot = _boot_time()
        while not self._stop_event.wait(self.interval):
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    self._sample(int(pid), boot)

    def _sample(self, pid: int, boot: float) -> None:
        try:
            if b"slicekeeper.workload.reference." not in Path(f"/proc/{pid}/cmdline").read_bytes():
                return
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return
        if boot + int(fields[19]) / self._hz < self._since:
            return  # started before this run
        self._ticks[pid] = (int(fields[11]), int(fields[12]))

    def stop(self) -> tuple[float, float]:
        """(user, system) seconds of every trainer seen."""
        self._stop_event.set()
        self.join()
        return (
            sum(u for u, _ in self._ticks.values()) / self._hz,
            sum(s for _, s in self._ticks.values()) / self._hz,
        )


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


class Figures(Protocol):
    run_dir: str


F = TypeVar("F", bound=Figures)


@dataclass
class Measured(Generic[F]):
    """What `measure_runs` gathered: the figures of the runs that worked, why the others did not."""

    figures: list[F]
    failures: list[str]
    keep: bool
    """Keep the work folder (asked for, or a run failed)."""


def measure_runs(
    runs: int,
    command: Callable[[Path], list[str]],
    analyse: Callable[[int, dict[str, Any]], F],
    *,
    work: Path,
    timeout: float,
    keep: bool,
    describe: Callable[[F], str],
) -> Measured[F]:
    """`runs` runs of `command(report_path)`, each report turned into figures by `analyse` (RunFailed:
    no figures from that run, its files kept); `describe` says what one run showed."""
    measured: Measured[F] = Measured([], [], keep)
    for run in range(1, runs + 1):
        report_path, log_path = work / f"report-{run}.json", work / f"run-{run}.log"
        argv = command(report_path)
        say(f"run {run}/{runs}: {' '.join(argv[1:])}")
        cpu = TrainerCpu()
        cpu.start()
        status, seconds, timed_out = run_once(argv, log_path, timeout, f"  run {run}:")
        user, system = cpu.stop()
        report: dict[str, Any] | None = None
        try:
            report = read_run_report(report_path, status, timed_out, timeout)
            report["trainer_cpu_seconds"] = {"user": user, "system": system}
            figures = analyse(run, report)
            if status != 0:
                raise RunFailed(f"slicekeeper exited with {status}")
        except RunFailed as error:
            where = f"; run directory {report['run_dir']}" if report and report.get("run_dir") else ""
            measured.failures.append(f"run {run}: {error}{where}")
            measured.keep = True
            say(f"run {run}/{runs}: FAILED after {seconds:.0f} s: {error}; log {log_path}")
            say("    " + tail(log_path).replace("\n", "\n    "))
            continue
        measured.figures.append(figures)
        say(f"run {run}/{runs}: ok in {seconds:.0f} s; {describe(figures)}")
        if not keep:
            shutil.rmtree(figures.run_dir, ignore_errors=True)
    return measured


def read_run_report(report_path: Path, status: int, timed_out: bool, timeout: float) -> dict[str, Any]:
    """The report of one `slicekeeper run`; RunFailed when it timed out or wrote none."""
    if timed_out:
        raise RunFailed(f"timed out after {timeout:.0f} s (slicekeeper exited with {status})")
    if not report_path.exists():
        raise RunFailed(f"no report (slicekeeper exited with {status})")
    report: dict[str, Any] = json.loads(report_path.read_text())
    return report


def finish(failures: list[str], work: Path, keep: bool) -> int:
    """The exit code: failed runs listed (their files kept), else the work folder removed unless kept."""
    if failures:
        say(f"{len(failures)} run(s) failed; their logs and reports are kept in {work}:")
        for failure in failures:
            say(f"  {failure}")
        return 1
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# --- reading a run's artifacts ----------------------------------------------------------------------
def read_events(path: Path) -> list[dict[str, Any]]:
    """One host's events.jsonl, in time order (a torn last line, from a killed writer, is skipped)."""
    events = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            events.append(json.loads(line))
    return sorted(events, key=lambda e: float(e["t"]))


def step_intervals(events: list[dict[str, Any]]) -> list[tuple[int, float, float]]:
    """(step, begin, end) of completed steps (step_begin -> step_end of the same generation), the
    first step of each start left out (it includes compilation)."""
    intervals = []
    begun: dict[tuple[int, int], float] = {}
    seen_generations: set[int] = set()
    for event in events:
        if event.get("source") != "workload":
            continue
        key = (int(event.get("generation", -1)), int(event.get("step", -1)))
        if event["type"] == "step_begin":
            begun[key] = float(event["t"])
        elif event["type"] == "step_end" and key in begun:
            if key[0] in seen_generations:
                intervals.append((key[1], begun[key], float(event["t"])))
            seen_generations.add(key[0])
    return intervals


def step_durations(events: list[dict[str, Any]]) -> list[float]:
    """Completed step durations, first of each start left out (see step_intervals)."""
    return [end - begin for _, begin, end in step_intervals(events)]


def checkpoint_save_seconds(events: list[dict[str, Any]]) -> list[float]:
    """Each checkpoint_save phase: its phase event to the next phase event of the same workload process.

    A save cut short by a fault (no phase event follows in that generation) is left out.
    """
    saves = []
    open_save: tuple[int, float] | None = None
    for event in events:
        if event.get("source") != "workload" or event["type"] != "phase":
            continue
        generation, t = int(event.get("generation", -1)), float(event["t"])
        if open_save is not None and open_save[0] == generation:
            saves.append(t - open_save[1])
        open_save = (generation, t) if event["phase"] == "checkpoint_save" else None
    return saves


# --- the table --------------------------------------------------------------------------------------
@dataclass
class Row:
    metric: str
    values: list[float]
    unit: str
    target: str = "-"
    met: list[bool] = field(default_factory=list)
    """Per run; empty: no target."""

    def summary(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "unit": self.unit,
            "median": statistics.median(self.values),
            "min": min(self.values),
            "max": max(self.values),
            "target": self.target,
            "met": None if not self.met else all(self.met),
            "runs_meeting_target": None if not self.met else sum(self.met),
        }


def format_value(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value:.3f} s"
    if unit == "ms":
        return f"{value:.1f} ms"
    if unit == "%":
        return f"{value:.2f} %"
    return f"{value:.3f}"


def format_table(rows: list[Row], runs: int) -> str:
    """A Markdown table: metric, median, min, max, target, met? (met: in every run)."""
    header = ["metric", "median", "min", "max", "target", "met?"]
    lines = [header]
    for row in rows:
        if not row.met:
            met = "-"
        elif all(row.met):
            met = "yes"
        else:
            met = f"no ({sum(row.met)}/{runs} runs)"
        lines.append(
            [
                row.metric,
                format_value(statistics.median(row.values), row.unit),
                format_value(min(row.values), row.unit),
                format_value(max(row.values), row.unit),
                row.target,
                met,
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = [
        "| " + " | ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) + " |"
        for line in lines
    ]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


# --- a recovery's breakdown -------------------------------------------------------------------------
def breakdown_table(title: str, breakdown: dict[str, Any] | None) -> list[str]:
    """A fault's recovery part by part and host by host, in seconds (the report's
    `faults[].breakdown`, slicekeeper.recovery_breakdown), so the next bottleneck shows; no lines
    when the fault has none."""
    hosts = (breakdown or {}).get("hosts") or []
    if not hosts:
        return []
    parts = [p for p in (*PARTS, "total") if any(p in h for h in hosts)]
    widths = [max(len(LABELS.get(p, p)), 5) + 2 for p in parts]
    header = "".join(f"{LABELS.get(p, p):>{w}}" for p, w in zip(parts, widths, strict=True))
    lines = [f"{title}: seconds per part", "  " + f"{'host':<6}" + header]
    for host in hosts:
        cells = "".join(
            f"{host[p]:>{w}.2f}" if isinstance(host.get(p), int | float) else f"{'-':>{w}}"
            for p, w in zip(parts, widths, strict=True)
        )
        lines.append("  " + f"{host['host']:<6}" + cells)
    return lines
