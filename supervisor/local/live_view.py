"""What `slicekeeper run` shows while the job runs: a live view in a terminal, plain lines elsewhere.

The local runtime watches the leader's status (every half second) and its events. A person at a
terminal wants one view redrawn in place: the job's progress, each host's state and the last few
events. A log (CI, `| tee`, a test reading the pipe) wants lines it can grep: every event as it comes
and a status line every few seconds, not one per status message. The runtime feeds one `RunView`
and does not care which it is; `run_view` picks it from where the output goes, or from
`slicekeeper run --progress`. The live view draws with `rich` (its Live display, progress bar and
tables), so no escape code is written by hand here.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, TextIO

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn
from rich.table import Table
from rich.text import Text
from slicekeeper.supervisor import messages

ProgressMode = Literal["auto", "live", "plain"]
PROGRESS_MODES: tuple[ProgressMode, ...] = ("auto", "live", "plain")

PLAIN_STATUS_SECONDS = 5.0
"""The plain view's status lines are at least this far apart (the leader sends one every 0.5 s)."""
LIVE_REFRESHES_PER_SECOND = 2.0
EVENTS_SHOWN = 8
"""The live view's last events: older ones scroll away (`--progress plain` prints them all)."""
REPORTED_STATES = ("running", "stopping")
"""The job states in which the plain view prints status lines (not while hosts register, nor at the end)."""


class RunView(Protocol):
    """Everything the local runtime shows while a job runs goes through one of these."""

    def start(self) -> None:
        """The hosts are about to start: from now on status and events come in."""

    def stop(self) -> None:
        """The hosts have ended (or the run broke off): what follows is printed as plain lines."""

    def say(self, text: str) -> None:
        """One of the runtime's own lines (start, run directory, metrics, interrupted, the report)."""

    def event(self, text: str, at: float | None = None) -> None:
        """Something the job went through, at Unix time `at` (default: now)."""

    def status(self, status: messages.Status) -> None:
        """The leader's latest status of the job."""


def run_view(out: TextIO, mode: ProgressMode, *, job_name: str, total_steps: int) -> RunView:
    """The view for output `out`: live on a terminal (`auto`), or as `mode` forces."""
    if mode not in PROGRESS_MODES:
        raise ValueError(f"progress mode {mode!r} is not one of {PROGRESS_MODES}")
    if mode == "live" or (mode == "auto" and is_live_terminal(out)):
        return LiveView(Console(file=out, force_terminal=True), job_name=job_name, total_steps=total_steps)
    return PlainView(out, total_steps=total_steps)


def is_live_terminal(out: TextIO) -> bool:
    """Whether `out` is a terminal that can redraw in place (not a pipe, a file, nor TERM=dumb)."""
    try:
        terminal = out.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
    return terminal and os.environ.get("TERM", "").lower() not in ("dumb", "unknown")


def status_line(status: messages.Status, total: int) -> str:
    """The job's status in one line: the plain view's, and what tests and users grep for."""
    hosts = status.hosts
    training = [h for h in hosts if h.state not in ("parked", "lost")] or hosts
    step = min(h.step for h in training)
    losses = [h.loss for h in hosts if h.loss is not None]
    rates = [h.steps_per_second for h in training if h.steps_per_second]
    states = " ".join(f"{h.host}:{h.state}" for h in hosts)
    loss = f"{losses[0]:.4f}" if losses else "-"
    rate = f"{min(rates):.1f}" if rates else "-"
    return f"step {step:>5}/{total}  loss {loss}  {rate} steps/s  gen {status.generation}  hosts {states}"


def event_line(text: str, at: float | None = None) -> str:
    """An event as the plain view prints it: `  [HH:MM:SS] text`, local time."""
    return f"  [{time.strftime('%H:%M:%S', time.localtime(at))}] {text}"


class PlainView:
    """Lines for a log: every event and runtime line at once, a status line at most every `interval`
    seconds while the job runs or stops (by `clock`, monotonic unless a test gives its own)."""

    def __init__(
        self,
        out: TextIO,
        *,
        total_steps: int,
        interval: float = PLAIN_STATUS_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out = out
        self.total_steps = total_steps
        self.interval = interval
        self.clock = clock
        self._last_status: float | None = None

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def event(self, text: str, at: float | None = None) -> None:
        self.say(event_line(text, at))

    def status(self, status: messages.Status) -> None:
        if status.state not in REPORTED_STATES:
            return
        now = self.clock()
        if self._last_status is not None and now - self._last_status < self.interval:
            return
        self._last_status = now
        self.say("  " + status_line(status, self.total_steps))


@dataclass
class _HostSeen:
    step: int
    since: float
    """When the host was first seen at `step` (the leader's clock, Unix seconds)."""


STATE_STYLES = {
    "training": "green",
    "finished": "green",
    "lost": "bold red",
    "stopped": "yellow",
    "stopping": "yellow",
    "starting": "cyan",
    "parked": "dim",
}
JOB_STATE_STYLES = {"running": "green", "succeeded": "bold green", "failed": "bold red", "stopping": "yellow"}


class LiveView:
    """One view redrawn in place on `console` (a terminal): the job's state, a progress bar of its
    steps, a table of its hosts and its last events. The runtime's own lines are printed above it and
    stay; when the view stops, its last drawing stays too and what follows is printed below it.

    rich redraws it from a thread of its own (`refreshes_per_second`; 0: only when `refresh` is called),
    so what the runtime feeds and what that thread draws is kept under one lock.
    """

    def __init__(
        self,
        console: Console,
        *,
        job_name: str,
        total_steps: int,
        refreshes_per_second: float = LIVE_REFRESHES_PER_SECOND,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.console = console
        self.job_name = job_name
        self.total_steps = total_steps
        self.clock = clock
        self._lock = threading.Lock()
        self._status: messages.Status | None = None
        self._seen: dict[int, _HostSeen] = {}
        self._events: deque[tuple[float, str]] = deque(maxlen=EVENTS_SHOWN)
        self._progress = Progress(
            TextColumn("step"),
            BarColumn(bar_width=None),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[rate]}"),
            console=console,
            expand=True,
        )
        self._steps = self._progress.add_task("steps", total=total_steps, rate="")
        self._live = Live(
            console=console,
            get_renderable=self._drawing,
            auto_refresh=refreshes_per_second > 0,
            refresh_per_second=refreshes_per_second or 1.0,
        )

    def start(self) -> None:
        self._live.start(refresh=True)

    def stop(self) -> None:
        self._live.stop()

    def refresh(self) -> None:
        """Draw the view now (rich's thread does so on its own while it runs)."""
        self._live.refresh()

    def say(self, text: str) -> None:
        # Text, not a string: brackets in a line are not markup; soft_wrap: long paths are not cut.
        self.console.print(Text(text), soft_wrap=True)

    def event(self, text: str, at: float | None = None) -> None:
        when = self.clock() if at is None else at
        if self._live.is_started:
            with self._lock:
                self._events.append((when, text))
        else:  # before the hosts start or after they ended: a line of its own
            self.say(event_line(text, when))

    def status(self, status: messages.Status) -> None:
        with self._lock:
            self._status = status
            for host in status.hosts:
                seen = self._seen.get(host.host)
                if seen is None or seen.step != host.step:
                    self._seen[host.host] = _HostSeen(host.step, status.t)
        training = [h for h in status.hosts if h.state not in ("parked", "lost")] or status.hosts
        rates = [h.steps_per_second for h in training if h.steps_per_second]
        self._progress.update(
            self._steps,
            completed=min((h.step for h in training), default=0),
            rate=f"{min(rates):.1f} steps/s" if rates else "",
        )

    def _drawing(self) -> RenderableType:
        with self._lock:
            return Group(self._headline(), self._progress, self._hosts(), self._last_events())

    def _headline(self) -> Text:
        line = Text.assemble(("slicekeeper ", "bold"), (self.job_name, "bold cyan"))
        status = self._status
        if status is None:
            return line.append("  waiting for the leader", style="dim")
        line.append("  ").append(status.state, style=JOB_STATE_STYLES.get(status.state, ""))
        line.append(f"  generation {status.generation}")
        restarts = ", ".join(f"{cause} {count}" for cause, count in sorted(status.restarts.items()) if count)
        line.append(f"  restarts: {restarts or 'none'}")
        losses = [h.loss for h in status.hosts if h.loss is not None]
        if losses:
            line.append(f"  loss {losses[0]:.4f}")
        return line

    def _hosts(self) -> Table:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        for name in ("host", "machine", "state", "step", "steps/s", "loss", "last step"):
            table.add_column(name, justify="left" if name in ("machine", "state") else "right")
        status = self._status
        now = self.clock()
        for host in status.hosts if status is not None else []:
            seen = self._seen.get(host.host)
            table.add_row(
                str(host.host),
                host.machine or "-",
                Text(host.state, style=STATE_STYLES.get(host.state, "")),
                str(host.step),
                f"{host.steps_per_second:.1f}" if host.steps_per_second else "-",
                f"{host.loss:.4f}" if host.loss is not None else "-",
                f"{max(now - seen.since, 0.0):.1f} s ago" if seen is not None and host.step > 0 else "-",
            )
        return table

    def _last_events(self) -> RenderableType:
        title = Text("last events", style="bold")
        if not self._events:
            return Group(title, Text("no events yet", style="dim"))
        lines = Table.grid(padding=(0, 1))
        lines.add_column(style="dim", no_wrap=True)
        lines.add_column()
        for when, text in self._events:
            lines.add_row(time.strftime("%H:%M:%S", time.localtime(when)), Text(text))
        return Group(title, lines)
