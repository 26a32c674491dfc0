"""`slicekeeper run` at a terminal draws a live view; through a pipe it prints plain lines.

The CLI runs the fast SDK example loop job, once under a pseudo-terminal (as a user at a terminal
runs it), once with its output a pipe (as CI and `| tee` do), and once at a terminal stopped with
Ctrl-C typed on it. A host's workload is killed half-way, so that the runs have an event to show
while the runtime surely watches the leader (it may connect after the first hosts registered). What
each run wrote is checked for what its reader needs: the view redrawn in place and the report below
it; greppable status and event lines with no escape sequence; every host stopped and the cursor
shown again.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.cli_runs import (
    processes_mentioning,
    read_report,
    run_cli_in_terminal,
    run_job,
    sdk_loop_job,
)

CURSOR_UP = "\x1b[1A"
HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"
STATUS_LINE = re.compile(r"^  step +\d+/40  loss \S+  \S+ steps/s  gen \d+  hosts 0:\w+", re.MULTILINE)
EVENT_LINE = re.compile(r"^  \[\d\d:\d\d:\d\d\] crash detected on host 1: ", re.MULTILINE)
KILL = ("--chaos", "kill:host=1@step=20")


def test_at_a_terminal_the_run_draws_a_live_view_and_prints_the_report_below_it(tmp_path):
    job = sdk_loop_job(tmp_path / "job.yaml")
    report_path = tmp_path / "report.json"
    run = run_cli_in_terminal("run", str(job), "--report", str(report_path), *KILL)
    assert run.returncode == 0, run.screen[-3000:]
    screen = run.screen
    assert CURSOR_UP in screen and screen.rfind(HIDE_CURSOR) < screen.rfind(SHOW_CURSOR)
    view, below = screen.rsplit(f"job {read_report(report_path)['job']}: succeeded", 1)
    for drawn in ("machine", "host-3", "last events", "crash detected on host 1: "):
        assert drawn in view
    assert re.search(r"\d+/40", view)  # the progress bar's steps
    assert not STATUS_LINE.search(view) and not EVENT_LINE.search(view)  # no plain lines in the view
    assert f"report: {report_path}" in below
    assert "run directory:" in view  # the start lines stay above the view
    report = read_report(report_path)
    assert report["state"] == "succeeded" and report["steps_completed"] == 40
    assert processes_mentioning(report["run_dir"]) == []


def test_through_a_pipe_the_run_prints_status_and_event_lines_without_escape_sequences(tmp_path):
    result, report = run_job(tmp_path, *KILL)
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout
    assert "  run directory: " in result.stdout
    assert STATUS_LINE.search(result.stdout), result.stdout
    assert EVENT_LINE.search(result.stdout), result.stdout
    assert f"  report: {tmp_path / 'report.json'}" in result.stdout
    assert processes_mentioning(report["run_dir"]) == []


def test_ctrl_c_at_the_terminal_stops_every_host_and_shows_the_cursor_again(tmp_path):
    job = sdk_loop_job(tmp_path / "job.yaml", steps=100000)
    report_path = tmp_path / "report.json"
    run = run_cli_in_terminal("run", str(job), "--report", str(report_path), ctrl_c_after="training")
    assert run.returncode == 1, run.screen[-3000:]
    assert "slicekeeper: interrupted; stopping every host" in run.screen
    assert run.screen.rfind(HIDE_CURSOR) < run.screen.rfind(SHOW_CURSOR)
    report = read_report(report_path)
    assert report["state"] == "interrupted"
    assert processes_mentioning(report["run_dir"]) == []
    assert Path(report["run_dir"]).is_dir()
