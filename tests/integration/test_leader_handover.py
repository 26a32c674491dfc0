"""Losing the leader's host costs a restart, never the job: the hand-over, end to end.

The leader runs in one host's supervisor (host 0 at the start). When that host is lost, another host
takes the job's lease (supervisor.leader.election), carries on the newest journal a member holds, and
treats host 0 like any lost host: a stop, the policy's decision (here: a spare takes over), the next
generation. When only host 0's supervisor process dies (chaos `crash-supervisor`), the runtime starts
it again on the same machine, the lease its predecessor held is released at once, and the restart is
a crash of host 0, restored from the disks every machine kept. Either way the job ends as if nothing
happened to its parameters, and the report shows the hand-over.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from tests.support.cli_runs import (
    ROOT,
    processes_mentioning,
    read_report,
    run_job,
    sdk_loop_fingerprint,
    sdk_loop_job,
    started_cli,
    supervisor_of,
)
from tests.support.recovery_checks import problems, tiers

STEPS = 40  # run_job's default
LOCKSTEP = ROOT / "tests" / "fixtures" / "lockstep_loop.py"
ELASTIC_STEPS = 160
"""Steps of the scaled-down hand-overs: the SDK loop's hosts do not wait for each other or for a
leader, so they train on while the leader is handed over; with 100 steps, beside another worker's
run, they had reached the last one before the successor's restart, and the job ended before the
capacity that came back at step 70 could be offered (a fresh clone's make test, two workers)."""
T = TypeVar("T")


def test_losing_the_leaders_host_hands_the_job_to_another_host(tmp_path, clean_fingerprint):
    result, report = run_job(tmp_path, "--spares", "1", "--chaos", "lose:host=0@step=15")
    assert result.returncode == 0, result.stderr[-3000:]
    assert problems(report, fingerprint=clean_fingerprint, steps=STEPS) == []
    assert report["restarts"] == {"host_lost": 1}
    assert report["hot_swaps"]["hosts"] == [0]
    [change] = report["leader_changes"]
    assert (change["from_host"], change["from_machine"], change["term"]) == (0, "host-0", 2)
    assert change["to_host"] in (1, 2, 3) and 0 < change["leaderless_seconds"] < 15
    # The lost host's fault fired once: the old leader journaled it before its machine vanished, so the
    # spare that took host 0 over does not fire it again.
    assert [f["kind"] for f in report["faults"]] == ["lose"]
    assert "leader change: host 0 -> host" in result.stdout
    assert processes_mentioning(report["run_dir"]) == []


def test_the_hosts_stalled_by_the_lost_leader_are_not_blamed(tmp_path):
    """In lockstep the other hosts fail with the lost one (their barrier is gone): the restart is still
    put down to the lost host, not to a crash of the hosts that noticed."""
    result, report = run_job(
        tmp_path,
        "--spares",
        "1",
        "--chaos",
        "lose:host=0@step=12",
        steps=24,
        workload={"command": [sys.executable, str(LOCKSTEP)]},
        checkpoint={"interval": 4, "persistent": None},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert report["restarts"] == {"host_lost": 1}
    assert len(report["leader_changes"]) == 1 and report["hot_swaps"]["hosts"] == [0]


def test_a_crashed_leader_supervisor_is_started_again_and_the_job_goes_on(tmp_path, clean_fingerprint):
    spec = "crash-supervisor:host=0@step=15"
    result, report = run_job(tmp_path, "--chaos", spec)
    assert result.returncode == 0, result.stderr[-3000:]
    assert problems(report, fingerprint=clean_fingerprint, steps=STEPS) == []
    assert report["restarts"] == {"crash": 1} and report["hot_swaps"]["count"] == 0  # the machine serves on
    [change] = report["leader_changes"]
    assert (change["from_host"], change["from_machine"]) == (0, "host-0") and change["term"] >= 2
    assert "host-0: its supervisor died (SIGKILL); starting it again on the same machine" in result.stdout
    # Fired once: the machine noted it before its supervisor died of it, so the next one on that
    # machine, which reaches step 15 again, does not fire it again.
    [fault] = report["faults"]
    assert (fault["kind"], fault["detected_as"]) == ("crash-supervisor", "crash")
    host_0 = Path(report["run_dir"]) / "host-0"
    assert json.loads((host_0 / "machine.json").read_text())["fired"] == [spec]
    # Both supervisors' accounts of host 0 count: the one that crashed and the one after it.
    assert report["hosts"][0]["machines"] == ["host-0", "host-0"]
    assert processes_mentioning(report["run_dir"]) == []


def test_a_crash_loop_that_loses_its_leader_midway_still_fails_after_exactly_its_restart_budget(tmp_path):
    """The budget lives in the job's memory, which the next leader carries on: killing the leader
    cannot buy a crash loop more restarts. Every start crashes (after 2 s, without a step); once the
    third generation started, host 0's supervisor (the leader) is killed; the runtime starts it again
    and a leader is elected again. The loss costs a restart of its own, and the budget of 3 still
    ends the job at the next crash."""
    crash_loop = [sys.executable, "-c", "import sys, time; time.sleep(2); sys.exit(3)"]
    job = sdk_loop_job(
        tmp_path / "job.yaml",
        workload={"command": crash_loop},
        health={"maxRestarts": 3, "maxRestartsWithoutProgress": 10},
    )
    report_path = tmp_path / "report.json"
    with started_cli("run", str(job), "--report", str(report_path)) as process:
        assert process.stdout is not None
        run_dir = None
        for line in process.stdout:
            if "run directory:" in line:
                run_dir = line.split("run directory:")[1].split()[0]
            if "generation 2 starting" in line:
                break
        assert run_dir is not None
        os.kill(supervisor_of(run_dir, "host-0"), signal.SIGKILL)  # the leader, in the middle of the loop
        _, err = process.communicate(timeout=120)
    assert process.returncode == 1, err[-3000:]
    report = read_report(report_path)
    assert sum(report["restarts"].values()) == 3, report["restarts"]
    # Counted apart from the leaders' memory: the stops host 1 itself carried out, and the generations.
    host_1 = json.loads((Path(run_dir) / "host-1" / "report.json").read_text())
    assert sum(host_1["restarts"].values()) == 3, host_1["restarts"]
    assert report["generations"] == 4
    assert "restart budget spent: 3 in-job restarts (spec.health.maxRestarts)" in err
    [change] = report["leader_changes"]
    assert change["from_host"] == 0
    assert processes_mentioning(run_dir) == []


ELASTIC_AND_REMEMBERING = """
from slicekeeper.policy import Action, CapacityReturned, Context, Crash, Fail, HostLost, Ignore
from slicekeeper.policy import RestartInJob, ScaleDown, ScaleUp, Straggler


def on_host_lost(event: HostLost, context: Context) -> Action:
    return ScaleDown()


def on_crash(event: Crash, context: Context) -> Action:
    earlier = [d.event.kind for d in context.history]
    if earlier[:1] != ["host_lost"]:
        return Fail(reason=f"the history does not start with the scale-down: {earlier}")
    return RestartInJob()


def on_capacity_returned(event: CapacityReturned, context: Context) -> Action:
    return ScaleUp() if context.can_scale_up() else Ignore()


def on_straggler(event: Straggler, context: Context) -> Action:
    return Ignore()
"""
"""Scales down on a lost host, back up with capacity; restarts after a crash only if it remembers
the scale-down (a successor without the old leader's history fails the job)."""


def test_the_leader_lost_while_the_job_runs_scaled_down_leaves_its_successor_the_smaller_world(tmp_path):
    """A hand-over in the middle of an elastic episode: slice 1 dropped (host 3 lost), then host 0's
    supervisor, the leader, crashes. Its successor carries on the world as it was (slice 0 active,
    host 2 parked), restarts slice 0 alone, and scales back up when capacity returns."""
    policy = tmp_path / "policy.py"
    policy.write_text(ELASTIC_AND_REMEMBERING)
    result, report = run_job(
        tmp_path,
        "--policy",
        str(policy),
        "--chaos",
        "lose:host=3@step=30,crash-supervisor:host=0@step=45,spare:+1@step=70",
        steps=ELASTIC_STEPS,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert report is not None
    [change] = report["leader_changes"]
    assert change["from_host"] == 0, change
    decisions = [d for d in report["decisions"] if d["event"]["kind"] != "straggler"]
    assert [(d["event"]["kind"], d["action"]["name"]) for d in decisions] == [
        ("host_lost", "scale_down"),
        ("crash", "restart"),
        ("capacity_returned", "scale_up"),
    ], decisions
    assert [w["hosts"] for w in report["world"]] == [4, 2, 4]
    # The hand-over itself is no capacity returning: host 2, idle before it, rejoined idle.
    assert report["restarts"] == {"host_lost": 1, "crash": 1, "capacity_returned": 1}
    assert report["params_fingerprint"] == sdk_loop_fingerprint(ELASTIC_STEPS)
    assert report["steps_completed"] == ELASTIC_STEPS
    assert processes_mentioning(report["run_dir"]) == []


def test_the_leader_lost_in_the_middle_of_a_hot_swap_lets_its_successor_finish_it(
    tmp_path, clean_fingerprint
):
    """Host 2 is lost and a spare is assigned its identity; before the next generation starts, host
    0's supervisor (the leader) is killed. Its successor carries on the journal, which holds the
    assignment: the spare joins as host 2 and restores host 2's shard from a peer, every other host
    restores its own, the swap is counted once, and the job ends with the fault-free parameters.

    Staged so that no machine's speed changes the story. Left alone, the leader starts the next
    generation a few milliseconds after the assignment, as soon as the other hosts acked the stop (a
    kill sent when the runtime prints the assignment lands after that start on a slower machine), and
    a successor elected elsewhere gathers the members without host 0 when its restarted supervisor is
    slow to start (host 0 is then taken for lost, and with it the only replica of host 2's shard).
    So once every host holds a checkpoint step (host 2's shard of it on a peer), the other members
    are paused before host 2's fault fires: the leader waits for their acks until it is killed, and
    they are resumed once host 0's restarted supervisor leads, so that all of them come back to it."""
    job = sdk_loop_job(tmp_path / "job.yaml", checkpoint=KEEP_EVERY_STEP)
    report_path = tmp_path / "report.json"
    args = ("--spares", "1", "--chaos", "lose:host=2@step=30")
    with started_cli("run", str(job), "--report", str(report_path), *args) as process:
        output = CliOutput(process)
        run_dir = Path(output.wait_for("run directory:").split("run directory:")[1].split()[0])
        held = awaited(lambda: every_host_holds_a_step(run_dir), "a step every host holds")
        with paused(run_dir, ["host-1", "host-3", "spare-0"]):
            assert not fired(run_dir, 2), "host 2's fault fired before the other members were paused"
            output.wait_for("hot-swap: spare 0 (spare-0) takes over host 2")
            kill_the_leader_and_await_it_back(run_dir)
        _, err = process.communicate(timeout=180)
    assert process.returncode == 0, err[-3000:]
    report = read_report(report_path)
    assert problems(report, fingerprint=clean_fingerprint, steps=STEPS) == []
    # A restore, not a start from scratch: the step every host held when they were paused, or newer;
    # the spare took host 2's shard from a peer (host 0), every other host its own.
    [swap] = [r for r in report["recoveries"] if r["cause"] == "host_lost"]
    assert swap["restore_step"] is not None and swap["restore_step"] >= held, (held, swap)
    assert swap["world"] == [0, 1, 2, 3], swap
    assert tiers(report, swap["generation"]) == {0: "local", 1: "local", 2: "peer", 3: "local"}
    # Counted once: journaled before the spare was told, carried on by the successor.
    assert report["hot_swaps"]["hosts"] == [2] and report["hot_swaps"]["count"] == 1
    assert report["hosts"][2]["machines"] == ["host-2", "spare-0"]
    # Host 0's crash, while the job was stopping for host 2, costs that restart or one of its own.
    assert report["restarts"]["host_lost"] == 1 and set(report["restarts"]) <= {"host_lost", "crash"}
    [change] = report["leader_changes"]
    assert (change["from_host"], change["to_host"]) == (0, 0) and change["term"] >= 2, change
    assert processes_mentioning(str(run_dir)) == []


KEEP_EVERY_STEP = {"maxToKeep": STEPS, "peer": {"replicas": 1, "maxToKeep": STEPS}}
"""Retention that drops no step of the job: what a host held when it was paused stays restorable."""
WAIT_SECONDS = 60.0
"""The longest a staged run is waited on for one thing; a member is paused at most this long."""


class CliOutput:
    """The CLI's output lines, read on a thread of their own: the test waits for one with a deadline
    while it watches the run directory (and the CLI never blocks on a full pipe meanwhile)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stdout = process.stdout
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._stdout:
            self._lines.put(line)
        self._lines.put(None)

    def wait_for(self, text: str) -> str:
        """The next line holding `text` (the lines before it are passed over)."""
        deadline = time.monotonic() + WAIT_SECONDS
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                break
            assert line is not None, f"the CLI ended before it said {text!r}"
            if text in line:
                return line
        raise AssertionError(f"the CLI did not say {text!r} within {WAIT_SECONDS:g} s")


def awaited(found: Callable[[], T | None], what: str) -> T:
    """What `found` returns once it is no longer None (polled), within `WAIT_SECONDS`."""
    deadline = time.monotonic() + WAIT_SECONDS
    while (value := found()) is None:
        assert time.monotonic() < deadline, f"no {what} within {WAIT_SECONDS:g} s"
        time.sleep(0.02)
    return value


def events(run_dir: Path, machine: str, kind: str) -> list[dict[str, Any]]:
    """The events of `kind` in a machine's event log (a line still being written is left out)."""
    log = run_dir / machine / "events.jsonl"
    text = log.read_text() if log.exists() else ""
    lines = text[: text.rfind("\n") + 1].splitlines()
    return [e for e in map(json.loads, (line for line in lines if f'"{kind}"' in line)) if e["type"] == kind]


def every_host_holds_a_step(run_dir: Path) -> int | None:
    """The newest step that hosts 0, 1 and 3 committed to their local tier and host 2's supervisor
    replicated to a peer (the copy its replacement restores), by their event logs; None: none yet."""
    held = [{e["step"] for e in events(run_dir, f"host-{h}", "checkpoint_saved")} for h in (0, 1, 3)]
    held.append({e["step"] for e in events(run_dir, "host-2", "replicated")})
    common = set.intersection(*held)
    return max(common) if common else None


def kill_the_leader_and_await_it_back(run_dir: Path) -> None:
    """Host 0's supervisor (the leader) killed while the other members are paused: its restarted
    supervisor, the only machine not paused, must lead the next term."""
    os.kill(supervisor_of(str(run_dir), "host-0"), signal.SIGKILL)
    successor = awaited(lambda: leader_after(run_dir, term=1), "leader after term 1")
    assert successor == "host-0", successor


def trains_in_a_later_generation(run_dir: Path, machine: str) -> bool | None:
    """True once the machine's workload committed a step in a generation after the first (None: not yet)."""
    return any(e["generation"] > 0 for e in events(run_dir, machine, "checkpoint_saved")) or None


def fired(run_dir: Path, host: int) -> bool:
    """Whether a chaos fault fired on the machine serving `host` (it logs one before inflicting it)."""
    return bool(events(run_dir, f"host-{host}", "chaos"))


def leader_after(run_dir: Path, term: int) -> str | None:
    """The machine holding the job's lease in a term after `term` (None: no such leader yet)."""
    try:
        lease = json.loads((run_dir / "leader-lease.json").read_text())
    except (OSError, ValueError):  # not written yet, or being written
        return None
    holder = str(lease["holder"])
    if int(lease["transitions"]) + 1 <= term or holder.startswith("released:"):
        return None
    return holder.split("/")[0]


@contextlib.contextmanager
def paused(run_dir: Path, machines: list[str]) -> Iterator[None]:
    """The supervisors of `machines` and their workloads stopped (SIGSTOP, as a cgroup freezer would
    stop a pod) for the block, then resumed (SIGCONT): a paused member acks no stop, so the leader
    starts no generation, and takes no lease, so it leads nobody."""
    pids: list[int] = []
    try:
        for machine in machines:
            supervisor = supervisor_of(str(run_dir), machine)
            os.kill(supervisor, signal.SIGSTOP)  # first: it starts nothing the loop below would miss
            pids.append(supervisor)
            for child in descendants(supervisor):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGSTOP)
                    pids.append(child)
        yield
    finally:
        for pid in reversed(pids):  # workloads first: their supervisor wakes to their events
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (its workload, the workload's children), parents first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if entry.name.isdigit():
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    found, frontier = [], [pid]
    while frontier:
        below = children.get(frontier.pop(0), [])
        found += below
        frontier += below
    return found


def test_the_leader_lost_in_the_middle_of_a_scale_up_lets_its_successor_finish_it(tmp_path):
    """Slice 1 dropped (host 3 lost), capacity returns and the policy scales back up: a spare is
    assigned host 3; then the leader's supervisor is killed. The successor finishes the scale-up.

    Staged like the hot-swap's, so that no machine's speed changes the story (a loaded machine printed
    the scale-up so late that the run had ended before the kill). Once host 1 trains in the
    scaled-down world, hosts 1 and 2 are paused before capacity returns: host 0 trains on alone to the
    step the spare comes at, the leader decides the scale-up, assigns the spare and waits for host 1's
    ack until it is killed. The spare is paused too, so that host 0's restarted supervisor is the only
    machine to lead; all are resumed once it does."""
    policy = tmp_path / "policy.py"
    policy.write_text(ELASTIC_AND_REMEMBERING)
    job = sdk_loop_job(tmp_path / "job.yaml", steps=ELASTIC_STEPS)
    report_path = tmp_path / "report.json"
    args = ("--policy", str(policy), "--chaos", "lose:host=3@step=30,spare:+1@step=60")
    with started_cli("run", str(job), "--report", str(report_path), *args) as process:
        output = CliOutput(process)
        run_dir = Path(output.wait_for("run directory:").split("run directory:")[1].split()[0])
        output.wait_for("scale-down: slice(s)")
        awaited(lambda: trains_in_a_later_generation(run_dir, "host-1"), "host 1 trains after the scale-down")
        with paused(run_dir, ["host-1", "host-2"]):
            assert not (run_dir / "spare-0").exists(), "the spare came before hosts 1 and 2 were paused"
            output.wait_for("scale-up: spare 0 (spare-0) takes over host 3")
            with paused(run_dir, ["spare-0"]):
                kill_the_leader_and_await_it_back(run_dir)
        _, err = process.communicate(timeout=180)
    assert process.returncode == 0, err[-3000:]
    report = read_report(report_path)
    assert [(e["kind"], e["from_hosts"], e["to_hosts"]) for e in report["scale_events"]] == [
        ("down", 4, 2),
        ("up", 2, 4),
    ]
    assert [w["hosts"] for w in report["world"]] == [4, 2, 4]
    assert report["hot_swaps"]["count"] == 0  # the spare came in through the scale-up
    assert report["hosts"][3]["machines"][-1] == "spare-0"
    [change] = report["leader_changes"]
    assert change["from_host"] == 0, change
    assert report["params_fingerprint"] == sdk_loop_fingerprint(ELASTIC_STEPS)
    assert report["steps_completed"] == ELASTIC_STEPS
    assert processes_mentioning(str(run_dir)) == []
