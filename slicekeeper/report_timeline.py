"""The run's timeline, as the page draws it: each host's steps over time, the faults' markers, and a
band per host coloured by what its time went to.

The page (slicekeeper.report_page) shows the run's figures and draws this as inline SVG; here is
the geometry, computed from the report and each of the job's machines' event log in the run
directory (`<run dir>/<machine>/events.jsonl`: the workload's `step_end` and the goodput
accountant's `interval` records, slicekeeper.goodput). Nothing else of the run directory is opened.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slicekeeper.event_logs import host_records, number
from slicekeeper.goodput import Category

CATEGORY_COLOURS: dict[str, str] = {
    Category.PRODUCTIVE: "#a5d6a7",
    Category.PROGRAM_STARTUP: "#90caf9",
    Category.TPU_INITIALIZATION: "#ce93d8",
    Category.TRAINING_PREP: "#b39ddb",
    Category.DATA_LOADING: "#80deea",
    Category.CHECKPOINT_SAVE: "#ffe082",
    Category.CHECKPOINT_RESTORE: "#ffb74d",
    Category.WASTED_PROGRESS: "#f48fb1",
    Category.INFRASTRUCTURE_RECOVERY: "#e53935",
    Category.SCALED_DOWN: "#a1887f",
    Category.OTHER: "#e0e0e0",
}
"""Each goodput category's colour in the bands and the legend; badput stands out from the pale green."""
UNKNOWN_COLOUR = "#9e9e9e"

HOST_COLOURS = ["#1b5e20", "#0d47a1", "#4a148c", "#e65100", "#006064", "#880e4f", "#3e2723", "#33691e"]
"""The hosts' step lines (cycled for more hosts)."""

MARKER_STYLES: dict[str, tuple[str, str]] = {
    "fault": ("#b71c1c", ""),
    "detection": ("#ef6c00", "6 3"),
    "recovery": ("#1565c0", "2 3"),
}
"""Marker kind -> (colour, stroke dash); the label rows above the chart follow this order."""
MARKER_NAMES = {"fault": "fault", "detection": "detected", "recovery": "training again"}

PLOT_LEFT, PLOT_WIDTH, PLOT_RIGHT = 80, 1000, 30
LABEL_ROW = 14
PROGRESS_HEIGHT = 240
LANE_HEIGHT, LANE_GAP = 16, 4
AXIS_HEIGHT = 34


@dataclass
class HostTimeline:
    """One host's run over time, in seconds since the run started."""

    steps: list[tuple[float, int]] = field(default_factory=list)
    """(time, step) of every step completed, in the order they were (a restore goes back)."""
    intervals: list[tuple[float, float, str]] = field(default_factory=list)
    """(start, end, category) of every interval its accountant booked."""


# --- reading the event logs -------------------------------------------------------------------


def read_timelines(report: dict[str, Any], run_dir: Path | None = None) -> dict[int, HostTimeline]:
    """Every host's timeline from the event logs of the machines that served it."""
    started = number(report.get("started_at")) or 0.0
    timelines: dict[int, HostTimeline] = {}
    for index, kept in host_records(report, run_dir).items():
        timeline = timelines.setdefault(index, HostTimeline())
        for record in kept:
            kind = record.get("type")
            if kind == "step_end" and record.get("source") == "workload":
                t, step = number(record.get("t")), record.get("step")
                if t is not None and isinstance(step, int):
                    timeline.steps.append((t - started, step))
            elif kind == "interval" and record.get("source") == "goodput":
                start, end = number(record.get("start")), number(record.get("end"))
                if start is not None and end is not None and end > start:
                    timeline.intervals.append((start - started, end - started, str(record.get("category"))))
    return timelines


# --- drawing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    at: float
    label: str


@dataclass(frozen=True)
class Line:
    host: int
    colour: str
    points: str


@dataclass(frozen=True)
class Band:
    x: float
    width: float
    category: str
    colour: str
    title: str


@dataclass(frozen=True)
class Lane:
    host: int
    y: float
    bands: list[Band]


@dataclass(frozen=True)
class Marker:
    kind: str
    """fault, detection or recovery"""
    x: float
    label: str
    label_y: float
    anchor: str
    colour: str
    dash: str
    title: str


@dataclass(frozen=True)
class Timeline:
    width: int
    height: int
    left: int
    right: int
    top: int
    progress_bottom: int
    lanes_bottom: int
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    lines: list[Line]
    lanes: list[Lane]
    markers: list[Marker]
    categories: list[tuple[str, str]]
    """(category, colour) of the legend: those in the bands, in the order of slicekeeper.goodput."""


def nice_ticks(top: float, count: int = 8) -> list[float]:
    """Round values from 0 to `top`, about `count` of them (steps of 1, 2 or 5 times a power of ten)."""
    if top <= 0:
        return [0.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(top / step + 1e-9) + 1)]


def _clock(seconds: float, minutes: bool) -> str:
    """A time axis label: `m:ss` on a long axis, seconds on a short one."""
    if minutes:
        return f"{int(seconds // 60)}:{int(seconds % 60):02d}"
    return f"{seconds:g} s"


TIME_UNITS = ((2 * 86_400, 86_400, "d"), (3 * 3_600, 3_600, "h"))
"""(axis length from which, unit seconds, name): a simulated run of weeks is labelled in days."""


def time_ticks(end: float, count: int = 10) -> list[tuple[float, str]]:
    """Round times from 0 to `end` with their labels: days or hours on a long axis (a simulated run),
    `m:ss` from three minutes, seconds below."""
    for longer_than, unit, name in TIME_UNITS:
        if end >= longer_than:
            return [(t * unit, f"{t:g} {name}") for t in nice_ticks(end / unit, count)]
    return [(t, _clock(t, minutes=end >= 180)) for t in nice_ticks(end, count)]


def _thinned(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """At most the first and the last point of each pixel column (a long run has far more steps than
    the chart has pixels), in order."""
    kept: list[tuple[float, float]] = []
    column, last = None, None
    for point in points:
        here = round(point[0])
        if here != column:
            if last is not None and kept[-1] is not last:
                kept.append(last)
            kept.append(point)
            column = here
        last = point
    if last is not None and kept[-1] is not last:
        kept.append(last)
    return kept


def _bands(intervals: list[tuple[float, float, str]], x_of_time: float, width: int) -> list[Band]:
    """A host's intervals, one category per pixel column (the one that took most of its time), with
    neighbouring columns of the same category joined into one band. Time no interval covers (before
    its supervisor started, after it ended) is `other`, as in the report; a host without any
    interval has no band."""
    columns: list[dict[str, float]] = [{} for _ in range(width)]
    for start, end, category in intervals:
        left, right = max(0.0, start * x_of_time), min(float(width), end * x_of_time)
        column = int(left)
        while column < width and column < right:
            share = min(right, column + 1.0) - max(left, float(column))
            if share > 0:
                columns[column][category] = columns[column].get(category, 0.0) + share
            column += 1
    for shares in columns if intervals else []:
        uncovered = 1.0 - sum(shares.values())
        if uncovered > 1e-9:
            shares[Category.OTHER.value] = shares.get(Category.OTHER.value, 0.0) + uncovered
    bands: list[Band] = []
    run_start, run_category = 0, None
    for column in range(width + 1):
        shares = columns[column] if column < width else {}
        dominant = max(shares, key=shares.__getitem__) if shares else None
        if dominant != run_category:
            if run_category is not None:
                seconds = (column - run_start) / x_of_time
                bands.append(
                    Band(
                        x=float(PLOT_LEFT + run_start),
                        width=float(column - run_start),
                        category=run_category,
                        colour=CATEGORY_COLOURS.get(run_category, UNKNOWN_COLOUR),
                        title=f"{run_category}: {run_start / x_of_time:.2f} s to "
                        f"{column / x_of_time:.2f} s ({seconds:.2f} s)",
                    )
                )
            run_start, run_category = column, dominant
    return bands


@dataclass(frozen=True)
class _Moment:
    t: float
    kind: str
    label: str
    title: str


def _moments(report: dict[str, Any]) -> list[_Moment]:
    """What the markers show: each fault where it fired; each detection once (several faults of a
    generation share their detection, which the leader also lists, with the faults not injected);
    each distinct time training went on after a fault."""
    moments: list[_Moment] = []
    detections: dict[float, _Moment] = {}
    for detection in report.get("detections", []):
        t = number(detection.get("detected_at"))
        if t is not None and t not in detections:
            detections[t] = _Moment(
                t,
                "detection",
                f"{detection.get('kind')} detected",
                f"{detection.get('kind')} detected on host {detection.get('host')} at {t:.2f} s: "
                f"{detection.get('detail') or ''}",
            )
    resumed: dict[float, _Moment] = {}
    for fault in report.get("faults", []):
        where = f" host {fault['host']}" if int(fault.get("host", -1)) >= 0 else ""
        fired = number(fault.get("fired_at"))
        if fired is not None:
            moments.append(
                _Moment(
                    fired,
                    "fault",
                    f"{fault.get('kind')}{where}",
                    f"fault {fault.get('kind')}{where} at step {fault.get('step')}, {fired:.2f} s"
                    + (f": {fault['detail']}" if fault.get("detail") else ""),
                )
            )
        detected = number(fault.get("detected_at"))
        if detected is not None and detected not in detections:
            detections[detected] = _Moment(
                detected,
                "detection",
                f"{fault.get('detected_as')} detected",
                f"{fault.get('kind')}{where} detected as {fault.get('detected_as')} at {detected:.2f} s",
            )
        back = number(fault.get("resumed_at"))
        if back is not None and back not in resumed:
            resumed[back] = _Moment(back, "recovery", "training again", f"training again at {back:.2f} s")
    return sorted([*moments, *detections.values(), *resumed.values()], key=lambda m: (m.t, m.kind))


def timeline(report: dict[str, Any], timelines: dict[int, HostTimeline]) -> Timeline:
    """The geometry of the timeline's SVG: time axis, step lines, markers, bands."""
    hosts = sorted(timelines)
    end = max(
        [
            number(report.get("wall_seconds")) or 0.0,
            *(t for line in timelines.values() for t, _ in line.steps[-1:]),
            *(e for line in timelines.values() for _, e, _ in line.intervals[-1:]),
        ],
        default=0.0,
    )
    end = max(end, 1e-3)
    top_step = max(
        [int(report.get("steps_completed") or 0), 1, *(s for h in hosts for _, s in timelines[h].steps)]
    )
    x_of_time = PLOT_WIDTH / end
    top = LABEL_ROW * len(MARKER_STYLES) + 12
    progress_bottom = top + PROGRESS_HEIGHT
    lanes_top = progress_bottom + 12
    lanes_bottom = lanes_top + len(hosts) * (LANE_HEIGHT + LANE_GAP)

    def x(t: float) -> float:
        return round(PLOT_LEFT + min(max(t, 0.0), end) * x_of_time, 1)

    def y(step: float) -> float:
        return round(progress_bottom - step / top_step * PROGRESS_HEIGHT, 1)

    lines = []
    for n, host in enumerate(hosts):
        points = _thinned([(x(t), y(step)) for t, step in timelines[host].steps])
        if points:
            text = " ".join(f"{px:g},{py:g}" for px, py in points)
            lines.append(Line(host, HOST_COLOURS[n % len(HOST_COLOURS)], text))
    lanes = [
        Lane(
            host,
            lanes_top + n * (LANE_HEIGHT + LANE_GAP),
            _bands(timelines[host].intervals, x_of_time, PLOT_WIDTH),
        )
        for n, host in enumerate(hosts)
    ]
    rows = list(MARKER_STYLES)
    markers = []
    for moment in _moments(report):
        colour, dash = MARKER_STYLES[moment.kind]
        at = x(moment.t)
        markers.append(
            Marker(
                kind=moment.kind,
                x=at,
                label=moment.label,
                label_y=LABEL_ROW * (rows.index(moment.kind) + 1),
                anchor="end" if at > PLOT_LEFT + PLOT_WIDTH * 0.85 else "start",
                colour=colour,
                dash=dash,
                title=moment.title,
            )
        )
    seen = {band.category for lane in lanes for band in lane.bands}
    categories: list[tuple[str, str]] = [(c.value, CATEGORY_COLOURS[c]) for c in Category if c.value in seen]
    categories += [(c, UNKNOWN_COLOUR) for c in sorted(seen - {c.value for c in Category})]
    return Timeline(
        width=PLOT_LEFT + PLOT_WIDTH + PLOT_RIGHT,
        height=lanes_bottom + AXIS_HEIGHT,
        left=PLOT_LEFT,
        right=PLOT_LEFT + PLOT_WIDTH,
        top=top,
        progress_bottom=progress_bottom,
        lanes_bottom=lanes_bottom,
        x_ticks=[Tick(x(t), label) for t, label in time_ticks(end)],
        y_ticks=[Tick(y(s), f"{s:g}") for s in nice_ticks(top_step, 5)],
        lines=lines,
        lanes=lanes,
        markers=markers,
        categories=categories,
    )


# --- the page -----------------------------------------------------------------------------------
