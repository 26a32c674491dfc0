"""Which host stopped: naming the culprit of a hang from where every host's workload was.

A hang stalls every host of a job: the host that stopped holds up the step's collective, and every
other host waits in it. Each supervisor's hang timer sees silence, and whichever fires first reports
it; that is rarely the host that stopped. So at a hang report the leader asks every host where its
workload is (`Activity`, from the workload's SDK events) and names the host that is furthest behind:

    stage of a host = (step, how far into it): begun < own work done < ended

Where a host's workload stands says nothing when it stopped inside the collective itself, after its
own work: then every host is at (S, work done). So each supervisor also says what its workload's
process is doing (`process`, from /proc: "stopped" by SIGSTOP or a debugger, "gone", or "running"),
evidence that does not depend on where in the step it stopped: a host whose workload is stopped, or
gone while the others run, is the culprit before any comparison of stages.

The host that stopped inside its own work of step S is at (S, begun) while the others finished their
own work and wait at (S, work done); a host that stopped between steps (a checkpoint save after S) is
at (S, ended) while the others began S+1. A host whose supervisor does not answer at all (its whole
machine hung) is further behind than any. Among hosts equally far behind, the one silent longest is
named. When every host is at the same stage there is no evidence (a collective hung as a whole, a
loop that never calls `work_done()`, or a job only slower than its hang allowance): the reporter is
named and the reason says so, and the leader asks again one allowance later; only if no host moved in
between (`moved`) is the job restarted.

How sure a naming is (`Evidence`) decides whether the leader acts at once. A stopped or gone process
and a supervisor that does not answer are facts about that host: at once. Being furthest behind is
not: a host starved of CPU on a loaded machine is behind the others too, and moves on a moment later
(seen in a test suite's JAX runs: one host 2 s behind in its own work of step 2, restarted for a hang
that was none). So a host named only for being behind is asked about again one allowance later, and
the job restarts only if that host did not move in between.

Silence is measured by each supervisor on its own clock (seconds since the workload's last event), so
hosts' clocks need not agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum, IntEnum
from pathlib import Path
from typing import Any

from slicekeeper.protocol import Phase


class Stage(IntEnum):
    """How far a host got into its latest step."""

    BEGUN = 0
    WORK_DONE = 1
    """Its own work is done: it waits for the others in the step's collective."""
    ENDED = 2


RUNNING, STOPPED, GONE = "running", "stopped", "gone"
"""What a workload's process is doing, as its supervisor sees it (`process_state`)."""


def process_state(pid: int | None, proc: Path = Path("/proc")) -> str:
    """STOPPED when process `pid` is stopped (state T: SIGSTOP; t: a debugger), GONE when there is
    no such process (or only its zombie), RUNNING otherwise (running, sleeping, waiting on I/O)."""
    if pid is None:
        return GONE
    try:
        state = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return GONE
    return {"T": STOPPED, "t": STOPPED, "Z": GONE, "X": GONE}.get(state, RUNNING)


@dataclass(frozen=True)
class Activity:
    """Where one host's workload was when asked (from its SDK events)."""

    step: int
    """The latest step begun or ended (0 before the first step of a start from scratch)."""
    stage: Stage
    phase: str
    """The phase it reported last (`idle` in or between steps)."""
    silent_seconds: float
    """Seconds since its last event, on the answering supervisor's clock."""
    process: str = RUNNING
    """Its workload's process: RUNNING, STOPPED (SIGSTOP, a debugger) or GONE (`process_state`)."""

    def to_message(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "stage": self.stage.name.lower(),
            "phase": self.phase,
            "silent_seconds": round(self.silent_seconds, 3),
            "process": self.process,
        }

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> Activity:
        return cls(
            int(message["step"]),
            Stage[str(message["stage"]).upper()],
            str(message["phase"]),
            float(message["silent_seconds"]),
            str(message.get("process", RUNNING)),
        )

    def where(self) -> str:
        where = {
            Stage.BEGUN: f"in its own work of step {self.step}",
            Stage.WORK_DONE: f"waiting for the other hosts in step {self.step}",
            Stage.ENDED: f"after step {self.step}",
        }[self.stage]
        return where if self.phase == Phase.IDLE else f"{where} ({self.phase})"

    def describe(self) -> str:
        return f"{self.where()}, silent {self.silent_seconds:.1f} s"


class ActivityTracker:
    """A supervisor's view of its workload's progress, fed with the SDK's events."""

    def __init__(self) -> None:
        self._step = 0
        self._stage = Stage.ENDED
        self._phase = Phase.IDLE.value
        self._last = 0.0

    def restart(self, now: float, restore_step: int | None) -> None:
        """A new workload process: it resumes after `restore_step`."""
        self._step, self._stage, self._phase, self._last = (
            restore_step or 0,
            Stage.ENDED,
            Phase.IDLE.value,
            now,
        )

    def phase(self, now: float, phase: str) -> None:
        self._phase, self._last = phase, now

    def step_begun(self, now: float, step: int) -> None:
        self._step, self._stage, self._phase, self._last = step, Stage.BEGUN, Phase.IDLE.value, now

    def work_done(self, now: float, step: int) -> None:
        if step == self._step and self._stage is Stage.BEGUN:
            self._stage, self._last = Stage.WORK_DONE, now

    def step_ended(self, now: float, step: int) -> None:
        self._step, self._stage, self._last = step, Stage.ENDED, now

    def other(self, now: float) -> None:
        """Any other event (a checkpoint saved, ...): the workload is alive, its stage unchanged."""
        self._last = now

    def snapshot(self, now: float, process: str = RUNNING) -> Activity:
        return Activity(self._step, self._stage, self._phase, max(0.0, now - self._last), process)


class Evidence(Enum):
    """What a culprit was named on, and so what it takes to restart the job for it."""

    HALTED = "halted"
    """Its workload's process is stopped or gone, or its supervisor did not answer: act at once."""
    BEHIND = "behind"
    """It is furthest behind the others: act only if it has not moved one allowance later."""
    NONE = "none"
    """No host stands out (the reporter is named): act only if no host moved one allowance later."""


@dataclass(frozen=True)
class Culprit:
    host: int
    reason: str
    evidence: Evidence


def name_culprit(activities: Mapping[int, Activity | None], reporter: int) -> Culprit:
    """The host a hang is attributed to. `activities` holds every host of the running world; None
    for a host whose supervisor did not answer."""
    silent = sorted(host for host, activity in activities.items() if activity is None)
    if silent:
        host = reporter if reporter in silent else silent[0]
        return Culprit(host, f"the supervisor of host {host} did not answer", Evidence.HALTED)
    answered = {host: activity for host, activity in activities.items() if activity is not None}
    if not answered:
        return Culprit(reporter, "no host answered", Evidence.NONE)
    for state in (STOPPED, GONE):
        halted = sorted(host for host, activity in answered.items() if activity.process == state)
        if halted and len(halted) < len(answered):
            host = halted[0]
            others = sorted({answered[h].where() for h in answered if h != host})
            return Culprit(
                host,
                f"host {host} is {answered[host].describe()}, its workload process {state}; "
                f"the others are {' or '.join(others)}",
                Evidence.HALTED,
            )

    def behind(host: int) -> tuple[int, int, float]:
        activity = answered[host]
        return (activity.step, int(activity.stage), -activity.silent_seconds)

    if len({(a.step, a.stage) for a in answered.values()}) == 1:
        where = answered.get(reporter) or next(iter(answered.values()))
        return Culprit(reporter, f"no host stands out: every host is {where.where()}", Evidence.NONE)
    host = min(answered, key=lambda h: (*behind(h), h))
    others = sorted({answered[h].where() for h in answered if h != host})
    return Culprit(
        host,
        f"host {host} is {answered[host].describe()}; the others are {' or '.join(others)}",
        Evidence.BEHIND,
    )


def moved(
    before: Mapping[int, Activity | None], after: Mapping[int, Activity | None], elapsed: float
) -> list[int]:
    """The hosts whose workload went on between two askings `elapsed` seconds apart: it got to a later
    step or stage, or it said anything since (its silence grew by less than half the time between).
    A host that did not answer either time is not known to have moved."""
    went_on = []
    for host, then in before.items():
        now = after.get(host)
        if then is None or now is None:
            continue
        if (now.step, now.stage) > (then.step, then.stage) or (
            now.silent_seconds < then.silent_seconds + elapsed / 2
        ):
            went_on.append(host)
    return sorted(went_on)
