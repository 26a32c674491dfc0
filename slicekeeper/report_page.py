"""The run's page: one HTML file next to the JSON report, for people to look at.

The JSON report is for programs and `format_report` for a terminal; neither shows when things
happened. The page draws the run over time: the steps each host completed, a vertical marker where a
fault fired, where the job detected it and where training went on, and under them a band per host
coloured by what its time went to (docs/goodput.md). Then the per-host table, the faults and the
policy's decisions.

It must open anywhere (a laptop on a plane, a CI artifact): one file, the style inline, the charts
inline SVG drawn here, no script and no external resource; its Content-Security-Policy forbids any, so
a mistake cannot make it reach the network. Everything that comes from the job or its policy (the
job's name, reasons, details) goes through jinja2's autoescaping.

What it reads: the report (slicekeeper.report) and, for the timeline (slicekeeper.report_timeline,
its geometry), each of the job's machines' event log in the run directory. Nothing else of the run
directory is opened, the credentials least of all.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jinja2
import markupsafe

from slicekeeper.event_logs import number
from slicekeeper.goodput import BADPUT
from slicekeeper.recovery_breakdown import LABELS, PARTS
from slicekeeper.report_timeline import (
    CATEGORY_COLOURS,
    LANE_HEIGHT,
    MARKER_NAMES,
    MARKER_STYLES,
    UNKNOWN_COLOUR,
    HostTimeline,
    read_timelines,
    timeline,
)


def _fields(record: dict[str, Any], skip: Iterable[str]) -> str:
    """`key=value` for what a decision's event or action says besides its name."""
    left_out = set(skip)
    parts = []
    for key, value in record.items():
        if key in left_out or value is None or value == [] or value == {}:
            continue
        shown = value if isinstance(value, str | int | float) else json.dumps(value, sort_keys=True)
        parts.append(f"{key}={shown}")
    return ", ".join(parts)


def _breakable(name: str) -> markupsafe.Markup:
    """`name` (escaped) with a line break allowed after each underscore: a narrow column heading."""
    return markupsafe.Markup("_<wbr>").join(name.split("_"))


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()) if n) or "none"


def _seconds(value: Any, digits: int = 2) -> str:
    seconds = number(value)
    return "-" if seconds is None else f"{seconds:.{digits}f}"


def _recovery(fault: dict[str, Any]) -> dict[str, Any]:
    """One fault's recovery, part by part and host by host (slicekeeper.recovery_breakdown), each
    part's slowest host marked."""
    breakdown = fault["breakdown"]
    hosts = breakdown["hosts"]
    parts = [p for p in (*PARTS, "total") if any(number(h.get(p)) is not None for h in hosts)]
    slowest = breakdown.get("slowest", {})
    rows = [
        {
            "host": h["host"],
            "cells": [
                (_seconds(h.get(p)), (slowest.get(p) or {}).get("host") == h["host"] and p != "total")
                for p in parts
            ],
            "compiled": ", ".join(h.get("compiled") or []) or ("none" if "compiled" in h else "-"),
        }
        for h in hosts
    ]
    return {
        "title": f"{fault.get('kind')} on host {fault.get('host')} at step {fault.get('step')}",
        "parts": [LABELS.get(p, p) for p in parts],
        "rows": rows,
    }


def page_context(report: dict[str, Any], timelines: dict[int, HostTimeline]) -> dict[str, Any]:
    """What the template shows, every value ready to print."""
    badput = report.get("badput_seconds", {})
    wall = number(report.get("wall_seconds")) or 0.0
    shown = [
        c.value
        for c in BADPUT
        if any(h.get("badput_seconds", {}).get(c.value, 0) >= 0.05 for h in report.get("hosts", []))
    ]
    hosts = [
        {
            "host": h["host"],
            "place": f"{h.get('slice')} / {h.get('worker')}",
            "machines": ", ".join(dict.fromkeys(str(m) for m in h.get("machines", []))),
            "goodput": f"{h.get('goodput', 0.0):.3f}",
            "productive": _seconds(h.get("productive_seconds"), 1),
            "badput": [_seconds(h.get("badput_seconds", {}).get(c), 1) for c in shown],
            "restarts": _counts(h.get("restarts", {})),
            "faults": _counts(h.get("faults", {})),
            "checkpoint": "-" if h.get("last_checkpoint_step") is None else str(h["last_checkpoint_step"]),
            "step_ms": "-"
            if not h.get("typical_step_seconds")
            else f"{h['typical_step_seconds'] * 1000:.0f}",
            "exit_code": "-" if h.get("exit_code") is None else str(h["exit_code"]),
        }
        for h in report.get("hosts", [])
    ]
    faults = [
        {
            "kind": f.get("kind"),
            "host": f.get("host") if int(f.get("host", -1)) >= 0 else "-",
            "step": f.get("step"),
            "fired_at": _seconds(f.get("fired_at")),
            "detected_as": f.get("detected_as") or "-",
            "detection": _seconds(f.get("detection_seconds")),
            "recovery": _seconds(f.get("recovery_seconds")),
            "detail": f.get("detail") or "",
        }
        for f in report.get("faults", [])
    ]
    recoveries = [_recovery(f) for f in report.get("faults", []) if (f.get("breakdown") or {}).get("hosts")]
    decisions = [
        {
            "t": _seconds(d.get("t"), 1),
            "step": d.get("step"),
            "event": str(d.get("event", {}).get("kind")),
            "event_fields": _fields(d.get("event", {}), ("kind", "t")),
            "action": str(d.get("action", {}).get("name")),
            "action_fields": _fields(d.get("action", {}), ("name",)),
            "source": d.get("source"),
            "reason": d.get("reason") or "",
        }
        for d in report.get("decisions", [])
    ]
    return {
        "job": report.get("job", ""),
        "state": report.get("state", "unknown"),
        "failure_reason": report.get("failure_reason"),
        "summary": [
            ("goodput", f"{report.get('goodput', 0.0):.3f}"),
            ("steps completed", str(report.get("steps_completed", 0))),
            ("wall time", f"{wall:.1f} s"),
            ("restarts", _counts(report.get("restarts", {}))),
            ("faults", str(len(faults))),
            ("generations", str(report.get("generations", 1))),
            (
                "ideal step time",
                "-"
                if not report.get("ideal_step_seconds")
                else f"{report['ideal_step_seconds'] * 1000:.0f} ms",
            ),
        ],
        "badput": [
            (
                category,
                f"{seconds:.2f}",
                f"{100 * seconds / wall:.1f}" if wall else "0",
                CATEGORY_COLOURS.get(category, UNKNOWN_COLOUR),
            )
            for category, seconds in sorted(badput.items(), key=lambda kv: -kv[1])
            if seconds >= 0.05
        ],
        "timeline": timeline(report, timelines),
        "lane_height": LANE_HEIGHT,
        "marker_legend": [
            (kind, MARKER_NAMES[kind], colour, "dash" if dash else "")
            for kind, (colour, dash) in MARKER_STYLES.items()
        ],
        "has_steps": any(t.steps for t in timelines.values()),
        "badput_columns": [(category, _breakable(category)) for category in shown],
        "hosts": hosts,
        "faults": faults,
        "recoveries": recoveries,
        "decisions": decisions,
        "run_dir": report.get("run_dir", ""),
        "fingerprint": report.get("params_fingerprint") or "",
    }


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ job }}: {{ state }} - slicekeeper run</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #212121; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 8px; }
.state-succeeded { color: #2e7d32; } .state-failed, .state-interrupted { color: #c62828; }
.reason { color: #c62828; margin: 4px 0; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 12px 0; }
.card { border: 1px solid #e0e0e0; border-radius: 6px; padding: 6px 12px; min-width: 90px; }
.card .value { font-size: 18px; font-weight: 600; }
.card .name { color: #616161; font-size: 12px; }
table { border-collapse: collapse; margin: 4px 0; }
th, td { border-bottom: 1px solid #eee; padding: 3px 10px; text-align: left; vertical-align: top; }
th { background: #fafafa; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.num, #faults td:not(:last-child) { white-space: nowrap; }
.legend { display: flex; flex-wrap: wrap; gap: 14px; margin: 6px 0 0 80px; font-size: 12px; }
.swatch { display: inline-block; width: 12px; height: 12px; vertical-align: -2px; margin-right: 4px;
  border: 1px solid #bdbdbd; }
.line-swatch { display: inline-block; width: 18px; height: 0; vertical-align: 3px; margin-right: 4px;
  border-top: 2px solid; }
.dash { border-top-style: dashed; }
.muted { color: #757575; font-size: 12px; }
.bar { display: inline-block; height: 10px; }
svg text { font: 11px system-ui, sans-serif; fill: #424242; }
svg .marker-label { font-size: 11px; font-weight: 600; }
</style>
</head>
<body>
<h1>{{ job }}: <span class="state-{{ state }}">{{ state }}</span></h1>
{% if failure_reason %}<p class="reason">{{ failure_reason }}</p>{% endif %}
<div class="cards">
{% for name, value in summary %}
<div class="card"><div class="value">{{ value }}</div><div class="name">{{ name }}</div></div>
{% endfor %}
</div>

<h2>Timeline</h2>
{% set t = timeline %}
<svg id="timeline" role="img" aria-label="steps completed over time, faults and badput by host"
 xmlns="http://www.w3.org/2000/svg" width="{{ t.width }}" height="{{ t.height }}"
 viewBox="0 0 {{ t.width }} {{ t.height }}">
<g class="axes" stroke="#bdbdbd" stroke-width="1">
{% for tick in t.y_ticks %}
<line x1="{{ t.left }}" x2="{{ t.right }}" y1="{{ tick.at }}" y2="{{ tick.at }}" stroke="#f0f0f0"/>
{% endfor %}
{% for tick in t.x_ticks %}
<line x1="{{ tick.at }}" x2="{{ tick.at }}" y1="{{ t.top }}" y2="{{ t.lanes_bottom }}" stroke="#f0f0f0"/>
{% endfor %}
<line x1="{{ t.left }}" x2="{{ t.left }}" y1="{{ t.top }}" y2="{{ t.progress_bottom }}"/>
<line x1="{{ t.left }}" x2="{{ t.right }}" y1="{{ t.progress_bottom }}" y2="{{ t.progress_bottom }}"/>
<line x1="{{ t.left }}" x2="{{ t.right }}" y1="{{ t.lanes_bottom }}" y2="{{ t.lanes_bottom }}"/>
</g>
{% for tick in t.y_ticks %}
<text x="{{ t.left - 6 }}" y="{{ tick.at + 4 }}" text-anchor="end">{{ tick.label }}</text>
{% endfor %}
<text x="14" y="{{ (t.top + t.progress_bottom) / 2 }}" text-anchor="middle"
 transform="rotate(-90 14 {{ (t.top + t.progress_bottom) / 2 }})">step</text>
{% for tick in t.x_ticks %}
<text x="{{ tick.at }}" y="{{ t.lanes_bottom + 16 }}" text-anchor="middle">{{ tick.label }}</text>
{% endfor %}
<text x="{{ t.right }}" y="{{ t.lanes_bottom + 30 }}" text-anchor="end">time since the run started</text>
<g class="bands" shape-rendering="crispEdges">
{% for lane in t.lanes %}
<text x="{{ t.left - 6 }}" y="{{ lane.y + lane_height - 4 }}" text-anchor="end">host {{ lane.host }}</text>
{% for band in lane.bands %}
<rect class="band" data-host="{{ lane.host }}" data-category="{{ band.category }}" x="{{ band.x }}"
 y="{{ lane.y }}" width="{{ band.width }}" height="{{ lane_height }}" fill="{{ band.colour }}">
<title>host {{ lane.host }}: {{ band.title }}</title></rect>
{% endfor %}
{% endfor %}
</g>
<g class="steps" fill="none" stroke-width="1.5" stroke-linejoin="round">
{% for line in t.lines %}
<polyline class="host-steps" data-host="{{ line.host }}" stroke="{{ line.colour }}" stroke-opacity="0.8"
 points="{{ line.points }}"><title>host {{ line.host }}: steps completed</title></polyline>
{% endfor %}
</g>
<g class="markers">
{% for m in t.markers %}
<g class="marker marker-{{ m.kind }}"><title>{{ m.title }}</title>
<line x1="{{ m.x }}" x2="{{ m.x }}" y1="{{ m.label_y + 3 }}" y2="{{ t.lanes_bottom }}" stroke="{{ m.colour }}"
 stroke-width="1.5"{% if m.dash %} stroke-dasharray="{{ m.dash }}"{% endif %}/>
<text class="marker-label" x="{{ m.x + (3 if m.anchor == 'start' else -3) }}" y="{{ m.label_y }}"
 text-anchor="{{ m.anchor }}" style="fill: {{ m.colour }}">{{ m.label }}</text>
</g>
{% endfor %}
</g>
</svg>
<div class="legend">
{% for line in t.lines %}
<span><span class="line-swatch" style="border-color: {{ line.colour }}"></span>
host {{ line.host }} steps</span>
{% endfor %}
{% for kind, name, colour, dash in marker_legend %}
<span><span class="line-swatch {{ dash }}" style="border-color: {{ colour }}"></span>{{ name }}</span>
{% endfor %}
</div>
<div class="legend">
{% for category, colour in t.categories %}
<span class="legend-category" data-category="{{ category }}">
<span class="swatch" style="background: {{ colour }}"></span>{{ category }}</span>
{% endfor %}
</div>
{% if not has_steps %}<p class="muted">No step of any host was found in the run's event logs.</p>{% endif %}
<p class="muted">Lines: the step each host completed last (a restore goes back). Bands: what each host's time
went to, by goodput category; a pixel shows the category that took most of its time.</p>

<h2>Badput</h2>
{% if badput %}
<table>
<tr><th>category</th><th class="num">seconds</th><th class="num">% of wall</th><th></th></tr>
{% for category, seconds, share, colour in badput %}
<tr><td><span class="swatch" style="background: {{ colour }}"></span>{{ category }}</td>
<td class="num">{{ seconds }}</td><td class="num">{{ share }}</td>
<td><span class="bar" style="width: {{ share }}px; background: {{ colour }}"></span></td></tr>
{% endfor %}
</table>
{% else %}<p class="muted">None worth showing.</p>{% endif %}

<h2>Faults</h2>
{% if faults %}
<table id="faults">
<tr><th>kind</th><th>host</th><th class="num">step</th><th class="num">fired at (s)</th><th>detected as</th>
<th class="num">detection (s)</th><th class="num">recovery (s)</th><th>detail</th></tr>
{% for f in faults %}
<tr><td>{{ f.kind }}</td><td>{{ f.host }}</td><td class="num">{{ f.step }}</td>
<td class="num">{{ f.fired_at }}</td>
<td>{{ f.detected_as }}</td><td class="num">{{ f.detection }}</td><td class="num">{{ f.recovery }}</td>
<td>{{ f.detail }}</td></tr>
{% endfor %}
</table>
{% else %}<p class="muted">No fault was injected.</p>{% endif %}

{% if recoveries %}
<h2>Recoveries</h2>
<p class="muted">Where each second of a recovery went, from the fault to the first step beyond the progress
made before it, per host (seconds; <strong>bold</strong>: the slowest host of a part). Compiled: the programs
a host compiled again instead of loading them.</p>
{% for r in recoveries %}
<h3>{{ r.title }}</h3>
<table class="recovery">
<tr><th>host</th>{% for part in r.parts %}<th class="num">{{ part }}</th>{% endfor %}<th>compiled</th></tr>
{% for row in r.rows %}
<tr><td>{{ row.host }}</td>
{% for value, slowest in row.cells %}
<td class="num">{% if slowest %}<strong>{{ value }}</strong>{% else %}{{ value }}{% endif %}</td>
{% endfor %}
<td>{{ row.compiled }}</td></tr>
{% endfor %}
</table>
{% endfor %}
{% endif %}

<h2>Hosts</h2>
<table id="hosts">
<tr><th>host</th><th>slice / worker</th><th>machines</th><th class="num">goodput</th>
<th class="num">productive (s)</th>
{% for category, label in badput_columns %}
<th class="num" data-category="{{ category }}">{{ label }} (s)</th>
{% endfor %}
<th>restarts</th><th>faults</th><th class="num">last checkpoint</th><th class="num">step (ms)</th>
<th class="num">exit</th></tr>
{% for h in hosts %}
<tr><td>{{ h.host }}</td><td>{{ h.place }}</td><td>{{ h.machines }}</td><td class="num">{{ h.goodput }}</td>
<td class="num">{{ h.productive }}</td>
{% for value in h.badput %}<td class="num">{{ value }}</td>{% endfor %}
<td>{{ h.restarts }}</td><td>{{ h.faults }}</td><td class="num">{{ h.checkpoint }}</td>
<td class="num">{{ h.step_ms }}</td><td class="num">{{ h.exit_code }}</td></tr>
{% endfor %}
</table>

<h2>Decisions</h2>
{% if decisions %}
<table id="decisions">
<tr><th class="num">t (s)</th><th class="num">step</th><th>event</th><th>action</th><th>source</th>
<th>reason</th></tr>
{% for d in decisions %}
<tr><td class="num">{{ d.t }}</td><td class="num">{{ d.step }}</td>
<td>{{ d.event }}{% if d.event_fields %} <span class="muted">{{ d.event_fields }}</span>{% endif %}</td>
<td>{{ d.action }}{% if d.action_fields %} <span class="muted">{{ d.action_fields }}</span>{% endif %}</td>
<td>{{ d.source }}</td><td>{{ d.reason }}</td></tr>
{% endfor %}
</table>
{% else %}<p class="muted">The policy was not asked anything.</p>{% endif %}

<p class="muted">Run directory: {{ run_dir }}
{%- if fingerprint %}; parameters fingerprint {{ fingerprint }}{% endif %}. Written by slicekeeper run.</p>
</body>
</html>
"""

_ENVIRONMENT = jinja2.Environment(
    autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True
)
_PAGE = _ENVIRONMENT.from_string(_TEMPLATE)


def render_page(report: dict[str, Any], timelines: dict[int, HostTimeline]) -> str:
    """The page's HTML."""
    return _PAGE.render(page_context(report, timelines))


def page_path(report_path: Path) -> Path:
    """Where the page of the report at `report_path` goes: the same path with `.html`."""
    page = report_path.with_suffix(".html")
    return page if page != report_path else report_path.with_name(report_path.name + ".html")


def write_page(report: dict[str, Any], report_path: Path) -> Path:
    """Render the page of `report` (its timelines from the run directory it names) next to the report
    file; its path."""
    page = page_path(report_path)
    page.write_text(render_page(report, read_timelines(report)), encoding="utf-8")
    return page
