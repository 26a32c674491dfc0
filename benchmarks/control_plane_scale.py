"""Benchmark of the in-job control plane at 1,000 to 25,000 hosts: the production leader, simulated hosts.

Per size N, per run: two leader candidates (control_plane_leader.py: the real election over the
local lease file, the real `Leader`, TLS on) and N simulated hosts in a few processes
(control_plane_members.py: register, progress every `--step-seconds`, checkpoints, faults, stop
acknowledgements, activity answers, journals kept, re-registration after a hand-over). Then:

- steady state: the leader's CPU time (from /proc) over `--window` seconds of training, per host-step
  and as a share of one core (`leader_cpu_share`);
- the hang culprit (`culprit_s`): a host reports a hang, another says it is behind, its workload
  process stopped: from the report to the last host's stop (the leader asked every host where it
  is, named the culprit, the policy decided, every host was told to stop);
- restart rounds (`restart_round_s`, `--rounds` per run): a host reports a crash -> every host told
  to stop -> every stop acknowledged -> every host told to start: from the report to the last host's
  start; each host must be stopped and started exactly once per round;
- the journal (`journal_bytes_per_command`): bytes of journal received by all hosts together per
  journal written during the rounds (the first leader starts with `--history` faults behind it);
- hand-over (`handover_s`): the first leader's process killed (SIGKILL) with its host -> the second
  elected, every host reconnected and registered, every host given its first command of the new
  term: from the kill to the last host's first command (the lease's 3 s duration included); of it,
  `handover_rejoin_s`: from the second candidate's election (its log) to the last host registered
  with it, the part that grows with the job (the simulator's hand-over cost is fitted to it:
  control_plane_fit.py);
- the leader's peak resident memory (`peak_rss_mib`, VmHWM before it is killed);
- the leader's open connections in the steady state (`leader_connections`, its sockets in /proc:
  one per host today, and its listening one; issue 41's target is a few hundred at any size).

The critical path (`critical_path_round_s`, `critical_path_handover_s`): on this machine every
process shares two cores, so a round's wall time is mostly the simulated hosts' own CPU time, which
a job spreads over its hosts' machines. Each is also given as it would be with each process on a
machine of its own: the leader's CPU time on the path (from what its log says every 50 ms,
interpolated: the round from the crash report to the last start; the hand-over from the next
leader's election to the last first command), plus the most CPU time any member process spent per
relay on it (from its first stop to its last start; from its first host's loss of its leader to the
last first command of the new term), plus, for the hand-over, the wall time from the kill to the
next election (the lease lapsing). Per relay, the relay's members' own work is counted as if the
relay's machine did it too, and the leader's and the relays' work as if none overlapped: an upper
bound. Checked where both can be measured, 128 hosts (two member processes of one relay each, the
machine not loaded): a round of 0.266 s on the wall clock, 0.303 s by the critical path.

It prints a table (medians over `--runs` runs, each round counted) and one JSON line per N.

    .venv/bin/python -m benchmarks.control_plane_scale [--hosts N ...] [--runs 3] [--rounds 3]
        [--step-seconds 1] [--window 10] [--history 500]

With `--no-targets` a run fails only on a wrong answer (a host stopped or started other than once, a
journal not carried on, ...), not on a figure over its target.

With `--hosts-per-relay N` the simulated hosts reach the leader through relays (the production
supervisor/host/relay.py), one per N consecutive hosts, as `spec.controlPlane.relays` makes a job's.

The simulated hosts' processes run at `nice 10` (`--nice-members`): in a job the leader has a machine
of its own; here it shares two cores with them, and at 25,000 hosts, at the same priority, its event
loop ran seconds late and it stood down, no longer sure to hold its lease.

A size this machine cannot hold (a process may open at most `ulimit -Hn` files; the leader needs one
per host, or one per relay) is reported as not run, with the reason, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from slicekeeper.supervisor.ports import free_port

from benchmarks.control_plane_figures import RunFigures, misses, summarize, table
from benchmarks.control_plane_leader import CPU_SAID, ELECTED, LEASE_REQUESTS, REQUESTS_SAID_SECONDS
from benchmarks.control_plane_members import Stats
from slicekeeper import credentials

HERE = Path(__file__).resolve().parent
SIZES = (1000, 5000, 10000, 25000)
HOSTS_PER_PROCESS = 5000
"""Simulated hosts per member process (at most; at least two processes)."""
FD_MARGIN = 64


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_sockets(pid: int) -> int:
    """The sockets process `pid` holds open (its listening one among them)."""
    count = 0
    for link in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(link).startswith("socket:")
        except OSError:
            continue  # closed meanwhile
    return count


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


class BenchmarkFailed(Exception):
    """A run whose figures cannot be trusted (a host not stopped or started, a timeout)."""


class MemberGroup:
    """One member process: its hosts and its pipes (its output read by a thread, so reads time out)."""

    def __init__(self, first: int, count: int, process: subprocess.Popen[str]) -> None:
        self.first, self.count, self.process = first, count, process
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read_all, daemon=True).start()

    def _read_all(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put("")

    def holds(self, host: int) -> bool:
        return self.first <= host < self.first + self.count

    def order(self, **order: Any) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(order) + "\n")
        self.process.stdin.flush()

    def read(self, key: str, timeout: float) -> Any:
        """The next line of the process that carries `key`."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                break
            if not line:
                raise BenchmarkFailed(f"member process {self.first}.. ended (exit {self.process.poll()})")
            message = json.loads(line)
            if key in message:
                return message[key]
        raise BenchmarkFailed(f"member process {self.first}..: no {key!r} within {timeout:g} s")


def merged_stats(groups: list[MemberGroup]) -> Stats:
    """The member processes' stats together."""
    for group in groups:
        group.order(do="stats")
    return Stats.merged([group.read("stats", 120) for group in groups])


class Run:
    """One run at one size: the processes, and the measurements in order."""

    def __init__(self, args: argparse.Namespace, hosts: int, work: Path) -> None:
        self.args, self.hosts, self.work = args, hosts, work
        credentials.generate("control-plane-bench").write(work / "credentials")
        python = sys.executable
        # Through relays the lease candidates (the two leader processes) answer who leads, and the
        # members ask them instead of reading the lease (supervisor.host.who_leads).
        who_leads = {host: free_port() for host in (0, 1)} if args.hosts_per_relay else {}
        candidates = ",".join(f"127.0.0.1:{port}" for port in who_leads.values())
        self.leaders = [
            subprocess.Popen(
                [
                    python,
                    str(HERE / "control_plane_leader.py"),
                    "--run-dir",
                    str(work),
                    "--hosts",
                    str(hosts),
                    "--host",
                    str(host),
                    "--port",
                    str(free_port()),
                    *(["--first"] if host == 0 else []),
                    "--history",
                    str(args.history if host == 0 else 0),
                    "--connections",
                    str(-(-hosts // args.hosts_per_relay) if args.hosts_per_relay else hosts),
                    *(["--who-leads-port", str(who_leads[host])] if who_leads else []),
                    "--lease",
                    args.lease,
                ],
                stderr=(work / f"leader-{host}.log").open("w"),
            )
            for host in (0, 1)
        ]
        processes = max(2, -(-hosts // HOSTS_PER_PROCESS))
        per = -(-hosts // processes)
        if args.hosts_per_relay:  # a relay's group within one process
            per = -(-per // args.hosts_per_relay) * args.hosts_per_relay
        self.groups = []
        for first in range(0, hosts, per):
            count = min(per, hosts - first)
            process = subprocess.Popen(
                [
                    *(["nice", "-n", str(args.nice_members)] if args.nice_members else []),
                    python,
                    str(HERE / "control_plane_members.py"),
                    "--run-dir",
                    str(work),
                    "--first",
                    str(first),
                    "--count",
                    str(count),
                    "--step-seconds",
                    str(args.step_seconds),
                    "--hosts-per-relay",
                    str(args.hosts_per_relay),
                    "--candidates",
                    candidates,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            self.groups.append(MemberGroup(first, count, process))

    def group_of(self, host: int) -> MemberGroup:
        return next(group for group in self.groups if group.holds(host))

    def close(self) -> None:
        for group in self.groups:
            if group.process.poll() is None:
                group.order(do="quit")
        for process in [*self.leaders, *(group.process for group in self.groups)]:
            if process.poll() is None:
                process.terminate()
        for process in [*self.leaders, *(group.process for group in self.groups)]:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()

    def wait_started(self, generation: int, timeout: float) -> Stats:
        deadline = time.monotonic() + timeout
        while True:
            merged = merged_stats(self.groups)
            if merged.start_count.get(generation, 0) >= self.hosts:
                return merged
            if time.monotonic() > deadline:
                raise BenchmarkFailed(
                    f"generation {generation}: {merged.start_count.get(generation, 0)} of {self.hosts} hosts "
                    f"started within {timeout:g} s (hosts stopped by generation: {dict(merged.stop_count)}, "
                    f"started: {dict(merged.start_count)}); unexpected: {merged.unexpected[:5]}"
                )
            time.sleep(1)

    def measure(self) -> RunFigures:
        hosts, args = self.hosts, self.args
        timeout = 60 + hosts / 100
        say(f"  {hosts} hosts: connecting and starting (up to {timeout:.0f} s)")
        deadline = time.monotonic() + timeout
        while True:
            merged = merged_stats(self.groups)
            started = max(merged.start_count.values(), default=0)
            if started >= hosts:
                break
            if time.monotonic() > deadline:
                raise BenchmarkFailed(
                    f"{sum(merged.registrations.values())} registrations and {started} starts of {hosts} "
                    f"hosts within {timeout:g} s; unexpected: {merged.unexpected[:5]}"
                )
            say(f"    {sum(merged.registrations.values())} registered, {started} started")
            time.sleep(2)
        generation = max(merged.start_count)  # the history's generations come first
        leader = self.leaders[0].pid

        say(f"  steady state: {args.window:g} s of {args.step_seconds:g} s steps")
        time.sleep(2 * args.step_seconds)
        cpu0, rest0, t0, wall0 = cpu_seconds(leader), merged_stats(self.groups), time.monotonic(), time.time()
        time.sleep(args.window)
        cpu1, rest1, t1, wall1 = cpu_seconds(leader), merged_stats(self.groups), time.monotonic(), time.time()
        lines0, lines1 = rest0.progress_steps, rest1.progress_steps
        share = (cpu1 - cpu0) / (t1 - t0)
        per_step = (cpu1 - cpu0) / max(1, lines1 - lines0) * 1e6
        connections = open_sockets(leader)

        say("  the hang culprit")
        behind, reporter = hosts // 2, hosts - 1
        self.group_of(behind).order(do="behind", host=behind)
        self.group_of(reporter).order(do="fault", host=reporter, kind="hang")
        merged = self.wait_started(generation + 1, timeout)
        culprit = merged.stop_last[generation] - merged.sent[f"fault:{reporter}"]
        self.check_round(merged, generation)
        generation += 1

        rounds, stops, acks, journal, paths, leader_paths = [], [], [], [], [], []
        for index in range(args.rounds):
            say(f"  restart round {index + 1} of {args.rounds}")
            time.sleep(2 * args.step_seconds)
            seqs_before = set(merged_stats(self.groups).journal_bytes)
            crashed = 2 + index
            self.group_of(crashed).order(do="fault", host=crashed, kind="crash")
            merged = self.wait_started(generation + 1, timeout)
            sent = merged.sent[f"fault:{crashed}"]
            rounds.append(merged.start_last[generation + 1] - sent)
            leader_part = self.cpu_between("leader-0.log", sent, merged.start_last[generation + 1])
            leader_paths.append(leader_part)
            paths.append(leader_part + merged.path_cpu_round.get(generation + 1, 0.0))
            stops.append(merged.stop_last[generation] - sent)
            acks.append(merged.ack_last[generation] - sent)
            journal += [size for seq, size in merged.journal_bytes.items() if seq not in seqs_before]
            self.check_round(merged, generation)
            generation += 1

        rss = peak_rss_mib(leader)
        say("  hand-over: the first leader's process killed, with its host")
        time.sleep(2 * args.step_seconds)
        before = merged_stats(self.groups)
        terms_before = set(before.first_command)
        killed = time.time()
        self.leaders[0].send_signal(signal.SIGKILL)
        self.group_of(0).order(do="lose", host=0)
        deadline = time.monotonic() + timeout
        while True:
            time.sleep(1)
            merged = merged_stats(self.groups)
            new_terms = sorted(set(merged.first_command) - terms_before)
            if new_terms and self.everyone_commanded(new_terms[-1]):
                term = new_terms[-1]
                break
            if time.monotonic() > deadline:
                raise BenchmarkFailed(f"no new leader reached every host within {timeout:g} s")
        carried = self.journal_carried(term)
        if carried is not None:
            raise BenchmarkFailed(
                f"the leader of term {term} did not carry on its predecessor's journal: {carried}"
            )
        handover = merged.first_command[term] - killed
        last_registered = merged.registered.get(term, float("nan"))
        elected = self.elected_at(term)
        rejoin = last_registered - elected
        critical_handover = (
            (elected - killed)
            + self.cpu_between("leader-1.log", elected, merged.first_command[term])
            + merged.path_cpu_handover.get(term, 0.0)
        )
        time.sleep(2 * REQUESTS_SAID_SECONDS)  # the candidates' counts past the hand-over are said
        at_rest = self.lease_requests(wall0, wall1) + rest1.lease_reads - rest0.lease_reads
        in_handover = self.lease_requests(killed, last_registered) + merged.lease_reads - before.lease_reads
        return RunFigures(
            hosts,
            share,
            per_step,
            culprit,
            rounds,
            stops,
            acks,
            journal,
            handover,
            last_registered - killed,
            rejoin,
            rss,
            connections,
            at_rest / (wall1 - wall0),
            in_handover,
            paths,
            leader_paths,
            critical_handover,
        )

    def cpu_between(self, log: str, start: float, end: float) -> float:
        """The CPU seconds the candidate whose log is `log` spent from `start` to `end` (Unix seconds),
        interpolated between what it said every CPU_SAID_SECONDS."""
        said = [
            (float(at), float(cpu))
            for line in (self.work / log).read_text().splitlines()
            if line.startswith(CPU_SAID)
            for cpu, at in [line.removeprefix(CPU_SAID).split(" at ")]
        ]
        if not said:
            raise BenchmarkFailed(f"{log} says no CPU time")
        return _cpu_at(said, end) - _cpu_at(said, start)

    def lease_requests(self, start: float, end: float) -> int:
        """The lease requests the candidates made from `start` to `end` (Unix seconds), from what their
        logs said every REQUESTS_SAID_SECONDS."""
        total = 0
        for log in sorted(self.work.glob("leader-*.log")):
            said = [
                (float(at), int(count))
                for line in log.read_text().splitlines()
                if line.startswith(LEASE_REQUESTS)
                for count, at in [line.removeprefix(LEASE_REQUESTS).split(" at ")]
            ]
            total += _said_by(said, end) - _said_by(said, start)
        return total

    def elected_at(self, term: int) -> float:
        """When a candidate won `term` (its log's ELECTED line)."""
        said = f"{ELECTED} {term} at "
        for log in sorted(self.work.glob("leader-*.log")):
            for line in log.read_text().splitlines():
                if line.startswith(said):
                    return float(line.removeprefix(said))
        raise BenchmarkFailed(f"no candidate's log says it won term {term}")

    def journal_carried(self, term: int) -> str | None:
        """None when the first journal the leader of `term` wrote continues the last one its
        predecessor wrote; else what differs."""
        first: tuple[int, dict[str, Any]] | None = None
        last: tuple[int, dict[str, Any]] | None = None
        for index, group in enumerate(self.groups):
            path = self.work / f"journals-{index}.json"
            group.order(do="journals", path=str(path))
            group.read("journals", 120)
            for held_term, entry in json.loads(path.read_text()).items():
                if int(held_term) == term and (first is None or entry["first_seq"] < first[0]):
                    first = entry["first_seq"], entry["first"]
                if int(held_term) < term and (last is None or entry["last_seq"] > last[0]):
                    last = entry["last_seq"], entry["last"]
        if first is None or last is None:
            return "no replica holds " + ("the new leader's journal" if first is None else "the old one's")
        return continues(last[1], first[1])

    def everyone_commanded(self, term: int) -> bool:
        """Every host but the lost one got a command of `term` (counted by the processes' hosts)."""
        for group in self.groups:
            group.order(do="stats")
        counted = 0
        for group in self.groups:
            stats = group.read("stats", 120)
            counted += stats.get("commanded", {}).get(str(term), 0)
        return counted >= self.hosts - 1

    def check_round(self, merged: Stats, generation: int) -> None:
        world = range(self.hosts)
        stops = not_once_each(merged.stop_hosts.get(generation, []), world)
        starts = not_once_each(merged.start_hosts.get(generation + 1, []), world)
        wrong = [f"{what} {hosts}" for what, hosts in (("stopped", stops), ("started", starts)) if hosts]
        if wrong or merged.unexpected:
            raise BenchmarkFailed(
                f"generation {generation}: each of {self.hosts} hosts must be stopped and started exactly "
                f"once, but {'; '.join(wrong) or 'so they were'}; unexpected: {merged.unexpected[:5]}"
            )


def _cpu_at(said: list[tuple[float, float]], moment: float) -> float:
    """The CPU time at `moment`, from (when, CPU time) pairs in order: interpolated between the two
    around it (the first or the last outside them)."""
    before = [(at, cpu) for at, cpu in said if at <= moment]
    after = [(at, cpu) for at, cpu in said if at > moment]
    if not before or not after:
        return (before or after)[-1 if before else 0][1]
    (t0, c0), (t1, c1) = before[-1], after[0]
    return c0 + (c1 - c0) * (moment - t0) / (t1 - t0)


def _said_by(said: list[tuple[float, int]], moment: float) -> int:
    """The last count said at or before `moment` (0: none yet)."""
    return max((count for at, count in said if at <= moment), default=0)


def not_once_each(received: list[int], world: range) -> str | None:
    """None when each host of `world` received a command exactly once (`received`: the host of each
    one received, a host twice if it got it twice); else the hosts that did not (the first few)."""
    counts = Counter(received)
    wrong = {
        "more than once": sorted(host for host, count in counts.items() if count > 1),
        "never": [host for host in world if host not in counts],
        "outside the world": sorted(host for host in counts if host not in world),
    }
    said = [
        f"{what}: {hosts[:5]}{' ...' if len(hosts) > 5 else ''}" for what, hosts in wrong.items() if hosts
    ]
    return "; ".join(said) or None


CARRIED = ("faults", "detections", "recoveries", "restores", "hot_swaps", "leader_changes")
"""The job memory's records, which a new leader carries on and only adds to."""


def continues(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """None when journal `new` carries on journal `old` (its records and budgets, the policy's
    decisions, the world), adding to them only; else what it lost."""
    for name in CARRIED:
        before, after = old["memory"][name], new["memory"][name]
        if after[: len(before)] != before:
            return f"memory.{name}: {len(before)} records before, {len(after)} after, not a continuation"
    for kind, count in old["memory"]["restarts"].items():
        if new["memory"]["restarts"].get(kind, 0) < count:
            return f"memory.restarts[{kind}]: {count} before, {new['memory']['restarts'].get(kind, 0)} after"
    if new["memory"]["generation"] < old["memory"]["generation"]:
        return "memory.generation went back"
    decisions_before, decisions_after = old["remediation"]["decisions"], new["remediation"]["decisions"]
    if decisions_after[: len(decisions_before)] != decisions_before:
        return "remediation.decisions: not a continuation"
    if new["world"]["history"][: len(old["world"]["history"])] != old["world"]["history"]:
        return "world.history: not a continuation"
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--hosts", type=int, action="append", help=f"a size to run (repeatable; default {SIZES})"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3, help="restart rounds per run")
    parser.add_argument("--step-seconds", type=float, default=1.0)
    parser.add_argument("--window", type=float, default=10.0, help="seconds of steady state measured")
    parser.add_argument("--history", type=int, default=500, help="faults behind the first leader")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument(
        "--hosts-per-relay",
        type=int,
        default=0,
        help="members reach the leader through a relay per this many hosts (supervisor/host/relay.py; "
        "0: each connects directly)",
    )
    parser.add_argument(
        "--lease",
        choices=("local", "cluster"),
        default="local",
        help="the lease's timing: local (3 s, as `slicekeeper run`) or cluster (8 s, renewed once a "
        "retry, as in pods: what the API server would be asked)",
    )
    parser.add_argument(
        "--nice-members",
        type=int,
        default=10,
        help="the simulated hosts' processes run this much nicer than the leader candidates (0: the same): "
        "in a job the leader has a machine of its own, here it shares two cores with 25,000 simulated "
        "hosts, and a leader whose loop runs seconds late stands down (its lease no longer sure)",
    )
    parser.add_argument(
        "--no-targets",
        action="store_true",
        help="check every run's correctness and print the figures, but do not hold them to their targets "
        "(the suite's small run, on a machine other tests load)",
    )
    args = parser.parse_args(argv)
    for hosts in args.hosts or ():
        if hosts < 16 or hosts % 8:
            parser.error(f"--hosts {hosts}: a multiple of 8 hosts (slices of 8), at least 16")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    lines, failures = [], []
    for hosts in args.hosts or SIZES:
        connections = -(-hosts // args.hosts_per_relay) if args.hosts_per_relay else hosts
        if connections + FD_MARGIN > hard:
            failures.append(
                f"{hosts} hosts: not run: the leader keeps one connection per host and this machine lets a "
                f"process open at most {hard} files (ulimit -Hn; raising it needs CAP_SYS_RESOURCE)"
            )
            say(failures[-1])
            continue
        runs = []
        for index in range(args.runs):
            say(f"{hosts} hosts, run {index + 1} of {args.runs}")
            work = Path(tempfile.mkdtemp(prefix=f"control-plane-{hosts}-"))
            run = Run(args, hosts, work)
            try:
                runs.append(run.measure())
            except BenchmarkFailed as error:
                failures.append(f"{hosts} hosts, run {index + 1}: {error}")
                say(failures[-1])
                for log in sorted(work.glob("leader-*.log")):
                    say(
                        f"--- the last lines of {log.name}:\n" + "\n".join(log.read_text().splitlines()[-15:])
                    )
            finally:
                run.close()
                if not args.keep:
                    shutil.rmtree(work, ignore_errors=True)
        if runs:
            line = summarize(runs)
            lines.append(line)
            print(json.dumps(line), flush=True)
    if lines:
        print(table(lines), flush=True)
    for failure in failures:
        print(f"FAILED: {failure}", flush=True)
    missed = [] if args.no_targets else misses(lines)
    for miss in missed:
        print(f"MISSED: {miss}", flush=True)
    return 1 if failures or missed else 0


if __name__ == "__main__":
    sys.exit(main())
