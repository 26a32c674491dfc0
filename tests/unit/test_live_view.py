"""What `slicekeeper run` shows while a job runs (supervisor/local/live_view.py), fed by hand.

The plain view (a log, a pipe) prints every event and at most one status line per interval, in the
formats users and tests grep for; the live view (a terminal) draws the job's state, a progress bar,
the hosts and the last events, and redraws that in place. Which one a run gets depends on where its
output goes, or on `--progress`. Time comes from fake clocks: nothing here waits.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator

import pytest
from rich.console import Console
from slicekeeper.supervisor import messages
from slicekeeper.supervisor.local.live_view import (
    EVENTS_SHOWN,
    PROGRESS_MODES,
    LiveView,
    PlainView,
    run_view,
    status_line,
)

from slicekeeper.cli import parser

CURSOR_UP = "\x1b[1A"
ERASE_LINE = "\x1b[2K"
HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"
HEADLINE = "slicekeeper demo-job"


def status(step: int = 30, *, state: str = "running", t: float = 100.0) -> messages.Status:
    """Four hosts at `step` (host 3 one behind), host 1 served by a spare after a crash."""
    hosts = [
        messages.HostView(
            host=host,
            state="training",
            step=step - (host == 3),
            loss=0.25 if host == 0 else None,
            steps_per_second=12.5 - host,
            machine="spare-0" if host == 1 else f"host-{host}",
        )
        for host in range(4)
    ]
    return messages.Status(t=t, state=state, generation=2, restarts={"crash": 1}, hosts=hosts)


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# --- the plain view ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("interval", "lines"), [(5.0, 2), (0.0, 20)], ids=["throttled", "unthrottled"])
def test_a_burst_of_statuses_prints_at_most_one_line_per_interval(interval, lines):
    """The leader's 20 statuses over 10 s (one per half second): two lines at a 5 s interval; the
    same view without an interval (the negative control) prints one per status."""
    out, clock = io.StringIO(), FakeClock(0.0)
    view = PlainView(out, total_steps=40, interval=interval, clock=clock)
    for tick in range(20):
        clock.now = tick * 0.5
        view.status(status(step=tick))
    printed = out.getvalue().splitlines()
    assert len(printed) == lines
    assert all(line.startswith("  step ") and "steps/s" in line for line in printed)
    assert printed[0] == "  " + status_line(status(step=0), 40)


def test_every_event_is_printed_as_it_comes_with_its_time():
    out = io.StringIO()
    view = PlainView(out, total_steps=40, clock=FakeClock())
    texts = [f"checkpoint of step {n} committed" for n in range(30)]
    for text in texts:
        view.event(text, at=0.0)
        view.status(status())  # statuses in between hold no event back
    printed = [line for line in out.getvalue().splitlines() if "checkpoint" in line]
    assert len(printed) == len(texts)
    for line, text in zip(printed, texts, strict=True):
        assert re.fullmatch(r"  \[\d\d:\d\d:\d\d\] " + re.escape(text), line)


def test_no_status_line_while_hosts_register_or_once_the_job_ended():
    out = io.StringIO()
    view = PlainView(out, total_steps=40, interval=0.0, clock=FakeClock())
    for state in ("registering", "succeeded", "failed"):
        view.status(status(state=state))
    assert out.getvalue() == ""
    view.status(status(state="stopping"))  # the control: a job stopping its hosts is reported
    assert out.getvalue().startswith("  step ")


def test_the_status_line_keeps_the_format_users_grep_for():
    line = status_line(status(step=30), 40)
    assert line == (
        "step    29/40  loss 0.2500  9.5 steps/s  gen 2  hosts 0:training 1:training 2:training 3:training"
    )


def test_the_plain_view_writes_no_escape_sequence():
    out = io.StringIO()
    view = PlainView(out, total_steps=40, clock=FakeClock())
    view.start()
    view.say("  run directory: /tmp/run  (plan, logs, reports)")
    view.status(status())
    view.event("training finished on every host")
    view.stop()
    assert "\x1b" not in out.getvalue()


# --- the live view ----------------------------------------------------------------------------------


def live_view(clock: FakeClock, width: int = 120) -> tuple[LiveView, io.StringIO]:
    """A live view on a terminal console writing to a string, redrawn only when asked (no thread)."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system=None, width=width, height=60)
    view = LiveView(console, job_name="demo-job", total_steps=40, refreshes_per_second=0, clock=clock)
    return view, out


def plain_text(drawn: str) -> str:
    """What the terminal shows of `drawn`, without its escape sequences."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn).replace("\r", "")


def last_frame(drawn: str) -> str:
    return plain_text(drawn).rsplit(HEADLINE, 1)[1]


def test_the_live_view_draws_the_hosts_the_progress_and_the_last_events():
    clock = FakeClock(100.0)
    view, out = live_view(clock)
    view.start()
    view.status(status(step=30, t=98.0))
    view.status(status(step=31, t=99.0))  # every host took a step at t=99: host 3 is at 30, the others 31
    events = [f"event number {n:02d}" for n in range(EVENTS_SHOWN + 2)]
    for n, text in enumerate(events):
        view.event(text, at=50.0 + n)
    clock.now = 101.5
    view.refresh()
    view.stop()
    frame = last_frame(out.getvalue())
    assert frame.startswith("  running  generation 2  restarts: crash 1  loss 0.2500")
    assert re.search(r"step .*━.* 30/40\s+75%\s+9\.5 steps/s", frame)  # the slowest host's step and rate
    assert re.search(r"0\s+host-0\s+training\s+31\s+12\.5\s+0\.2500\s+2\.5 s ago", frame)
    assert re.search(r"1\s+spare-0\s+training\s+31\s+11\.5\s+-\s+2\.5 s ago", frame)
    assert re.search(r"3\s+host-3\s+training\s+30\s+9\.5\s+-\s+2\.5 s ago", frame)
    assert "last events" in frame
    assert [text for text in events if text in frame] == events[-EVENTS_SHOWN:]


def test_the_live_view_redraws_in_place_and_shows_the_cursor_again_when_it_stops():
    clock = FakeClock()
    view, out = live_view(clock)
    view.start()
    for step in (10, 20, 30):
        view.status(status(step=step))
        view.refresh()
    view.stop()
    drawn = out.getvalue()
    frames = drawn.split(HEADLINE)
    assert len(frames) == 1 + 5  # drawn at the start, at each refresh, and once more at the stop
    for before in frames[1:-1]:  # each next drawing begins by going back up over the previous one
        assert before.endswith(CURSOR_UP + ERASE_LINE), repr(before[-40:])
    assert "steps/s  gen" not in plain_text(drawn)  # no status line printed after another
    assert drawn.rfind(HIDE_CURSOR) < drawn.rfind(SHOW_CURSOR)


def test_runtime_lines_print_once_above_the_view_and_after_it_once_it_stopped():
    view, out = live_view(FakeClock())
    view.say("  run directory: /tmp/a/very/long/run/directory  (plan, logs, reports)")
    view.start()
    view.status(status())
    view.say("  metrics: host 0 http://127.0.0.1:9000/metrics [ok]")
    view.refresh()
    view.stop()
    view.say("job demo-job: succeeded")
    view.event("printed as a line once the view is gone", at=0.0)
    shown = plain_text(out.getvalue())
    assert shown.count("metrics: host 0 http://127.0.0.1:9000/metrics [ok]") == 1  # not markup
    assert shown.index("run directory:") < shown.index(HEADLINE)
    after = shown.rsplit(HEADLINE, 1)[1]
    assert after.index("last events") < after.index("job demo-job: succeeded")
    assert re.search(r"\n  \[\d\d:\d\d:\d\d\] printed as a line once the view is gone\n$", after)


def test_before_the_first_status_the_view_waits_for_the_leader():
    view, out = live_view(FakeClock())
    view.start()
    view.stop()
    frame = last_frame(out.getvalue())
    assert "waiting for the leader" in frame and "no events yet" in frame and "0/40" in frame


# --- which view ----------------------------------------------------------------------------------


@pytest.fixture
def terminal() -> Iterator[io.TextIOWrapper]:
    """The writing end of a pseudo-terminal: what `slicekeeper run` writes to at a user's terminal."""
    controller, end = os.openpty()
    with open(end, "w") as stream:
        yield stream
    os.close(controller)


@pytest.mark.parametrize(
    ("where", "mode", "term", "view"),
    [
        ("terminal", "auto", "xterm-256color", LiveView),
        ("terminal", "auto", "dumb", PlainView),
        ("pipe", "auto", "xterm-256color", PlainView),
        ("terminal", "plain", "xterm-256color", PlainView),
        ("pipe", "live", "dumb", LiveView),
    ],
)
def test_a_terminal_gets_the_live_view_unless_told_otherwise(terminal, monkeypatch, where, mode, term, view):
    monkeypatch.setenv("TERM", term)
    out = terminal if where == "terminal" else io.StringIO()
    assert type(run_view(out, mode, job_name="demo-job", total_steps=40)) is view


def test_the_run_command_takes_a_progress_mode(capsys):
    assert parser().parse_args(["run", "job.yaml"]).progress == "auto"
    for mode in PROGRESS_MODES:
        assert parser().parse_args(["run", "job.yaml", "--progress", mode]).progress == mode
    with pytest.raises(SystemExit) as refused:
        parser().parse_args(["run", "job.yaml", "--progress", "fancy"])
    error = capsys.readouterr().err
    assert refused.value.code == 2 and "--progress" in error and "fancy" in error
