"""Simulated members for the control-plane benchmark: many light hosts in one process, on the real wire.

Each simulated host does what a host's supervisor does on its connection to the leader, and nothing
else (no workload, no checkpoint files): it finds the leader the job's lease names, connects with
the job's TLS credentials, registers, and then follows the leader's commands in order, ignoring a
command of an older term (fencing): on `start` it trains (a `progress` line every step, a
`checkpoint` every `CHECKPOINT_EVERY` steps, a `restored` line when told to restore); on `stop` it
stops and acknowledges with what its disk holds; on `activity_request` it says where it is. It keeps
the newest journal written on it and, when its leader is lost, registers with the next one as a
rejoining member (that journal, its generation, its step), as `supervisor.host.membership` does.

The hosts of one process share one reader of the lease file (a real supervisor reads it alone) and
one step clock (a synchronous job's hosts end their steps together). Lines are written with the
protocol's encoder and read with `json.loads`: every line sent is one `messages.to_leader` accepts
(tests/unit/test_control_plane_bench.py checks each kind), and parsing the leader's commands with
pydantic here would make the simulation, not the leader, the bottleneck.

The benchmark's driver (control_plane_scale.py) runs a few of these processes and talks to each over
its stdin/stdout, one JSON object per line:
- in: {"do": "fault", "host": H, "kind": "crash"|"hang"}, {"do": "behind", "host": H} (asked
  where it is, that host says it is in its own work of the step, its workload process stopped: a
  hang the leader names at once, as the chaos's SIGSTOP makes it), {"do": "lose", "host": H} (its
  connection cut, never back: its machine is gone), {"do": "journals", "path": P} (the first and
  last journal of each term held here, written to P), {"do": "stats"}, {"do": "quit"};
- out: {"stats": {...}}
  (per generation and term: when the process's hosts got their stop and start, the journal bytes
  each journal `seq` cost, counts that must match: see `Stats`).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.host import who_leads
from slicekeeper.supervisor.host.relay import Relay, via_relay
from slicekeeper.supervisor.leader import journal_delta
from slicekeeper.supervisor.leader.election import LEASE_FILE, Lease, read_lease_file
from slicekeeper.supervisor.leader_connection import RETRY_PAUSE_SECONDS, open_control_connection
from slicekeeper.supervisor.tls import JobTls

from slicekeeper import protocol

CHECKPOINT_EVERY = 5
"""Steps between a simulated host's local checkpoints."""
KEPT_JOURNALS = 20
"""Journals (by seq) a process keeps: its hosts hold the newest, or are no replicas any more."""
LEASE_POLL_SECONDS = 0.1
CONNECTS_AT_ONCE = 64
"""TLS handshakes one process has in flight at once (a burst of thousands only times out)."""


@dataclass
class Stats:
    """What this process's hosts saw, for the driver to merge (times are Unix seconds)."""

    stop_last: dict[int, float] = field(default_factory=dict)
    """generation stopped -> when the last of this process's hosts got its stop."""
    stop_count: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    stop_hosts: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    """generation stopped -> this process's hosts that got its stop, once per stop received."""
    ack_last: dict[int, float] = field(default_factory=dict)
    start_last: dict[int, float] = field(default_factory=dict)
    """generation started -> when the last of this process's hosts got its start."""
    start_count: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    start_hosts: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    """generation started -> this process's hosts that got its start, once per start received."""
    journal_bytes: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    """journal seq -> bytes of it received by this process's hosts, in total."""
    journal_count: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    first_command: dict[int, float] = field(default_factory=dict)
    """term -> when the last of this process's hosts got its first command of that term."""
    commanded: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    """term -> how many of this process's hosts got a command of that term."""
    registered: dict[int, float] = field(default_factory=dict)
    """term -> when the last of this process's hosts registered with that term's leader."""
    registrations: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    """term -> registrations of this process's hosts with that term's leader."""
    sent: dict[str, float] = field(default_factory=dict)
    """what the driver asked (e.g. "fault:3") -> when it was said."""
    progress_lines: int = 0
    progress_steps: int = 0
    """Host-steps reported (a report carries the steps held back since the one before)."""
    lost_leader: int = 0
    lease_reads: int = 0
    """Reads of the lease file (an API request each in a cluster); none when the candidates are asked."""
    path_cpu_round: dict[int, float] = field(default_factory=dict)
    """generation started -> this process's CPU seconds from its first stop of the generation before to
    its last start of this one, per relay (per host, without relays): a relay's part of the round's
    critical path, its members' included (merged: the most of any process)."""
    path_cpu_handover: dict[int, float] = field(default_factory=dict)
    """term -> this process's CPU seconds from its first host's loss of its leader to the last of its
    hosts' first command of that term, per relay (per host without relays)."""
    unexpected: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        """Something that should not happen (the first few are kept: the driver fails the run)."""
        if len(self.unexpected) < 5:
            self.unexpected.append(text[:300])

    def to_json(self) -> dict[str, Any]:
        return {name: dict(value) if isinstance(value, dict) else value for name, value in vars(self).items()}

    @classmethod
    def merged(cls, reports: list[dict[str, Any]]) -> Stats:
        """Several processes' stats (`to_json`) as one: of each time the latest, counts summed, lists of
        hosts joined."""
        merged = cls()
        for report in reports:
            for name, value in report.items():
                mine = getattr(merged, name)
                if isinstance(mine, defaultdict):  # counts, lists of hosts
                    for key, count in value.items():
                        mine[int(key)] += count
                elif isinstance(mine, dict):  # times (`sent` by what was said, the others by number)
                    for key, at in value.items():
                        key = key if name == "sent" else int(key)
                        mine[key] = max(mine.get(key, 0.0), at)
                elif isinstance(mine, list):
                    mine += value
                else:
                    setattr(merged, name, mine + value)
        return merged


class LeaseWatch:
    """The job's lease as the process's hosts see it every LEASE_POLL_SECONDS: read (at all times, as
    every supervisor reads it without relays), or, through relays, asked of the lease candidates only
    while one of its hosts looks for a leader, as a supervisor that is not one asks them
    (supervisor.host.who_leads: at its start and while its member looks, never at rest)."""

    def __init__(self, run_dir: Path, stats: Stats, candidates: list[str], tls: JobTls) -> None:
        self._path = run_dir / LEASE_FILE
        self._stats = stats
        self._candidates = candidates
        self._tls = tls
        self.term = 0
        self.address: str | None = None
        self._changed = asyncio.Event()
        self._looking = asyncio.Event()
        """Set while a host waits for a leader newer than the one it knows."""

    async def _lease(self) -> Lease | None:
        if self._candidates:
            _, lease = await who_leads.ask_candidates(self._candidates, self._tls)
            return lease
        self._stats.lease_reads += 1
        return await asyncio.to_thread(read_lease_file, self._path)

    async def run(self) -> None:
        while True:
            if self._candidates:
                await self._looking.wait()
            lease = await self._lease()
            if lease is not None and lease.leader is not None and lease.term != self.term:
                self.term, self.address = lease.term, lease.leader.address
                self._looking.clear()  # a host still looking says so again
                self._changed.set()
                self._changed = asyncio.Event()
            await asyncio.sleep(LEASE_POLL_SECONDS)

    async def newer_than(self, term: int) -> tuple[int, str]:
        while self.term <= term or self.address is None:
            self._looking.set()
            await self._changed.wait()
        return self.term, self.address


class SimulatedHost:
    def __init__(self, host: int, process: MemberProcess) -> None:
        self.host = host
        self.process = process
        self.writer: asyncio.StreamWriter | None = None
        self.term = 0
        self.generation: int | None = None
        self.step = 0
        self.training = False
        self.committed: list[int] = []
        self.journal_seq: int | None = None
        """The seq of the newest journal written on this host (the process keeps the journals)."""
        self.rank, self.progress_every = 0, 1
        self.held: list[tuple[int, float, float]] = []
        """Steps ended and not reported yet: (step, when, work)."""
        self.first_report = True
        self.behind = False
        self.gone = False
        self.joined = False
        self.kept: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        """Its connection to its relay, kept by the relay when its leader went (messages.LEADER_GONE)."""

    def say(self, message: dict[str, Any]) -> None:
        if self.writer is not None and not self.writer.is_closing():
            self.writer.write(protocol.encode({"t": time.time(), **message, "host": self.host}))

    async def run(self) -> None:
        known_term = 0
        while not self.gone:
            term, address = await self.process.lease.newer_than(known_term)
            known_term = term
            connected = self._kept_for(address) or await self.process.connect(address, self.host)
            while connected is None and self.process.lease.term == term:
                # Not listening yet (the lease is written before the server starts) or too busy to
                # answer: try it again, as a supervisor does (leader_connection.reach_leader).
                connected = await self.process.connect(address, self.host)
            if connected is None:
                continue  # a newer leader meanwhile
            reader, self.writer = connected
            self._register(term)
            await self._follow(reader)
            if self.gone:
                return
            self.process.leader_lost()
            self.process.stats.lost_leader += 1
            self.training = False

    def _kept_for(self, address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """The connection its relay kept, now naming the leader at `address` (None: none kept), as
        supervisor.host.membership does."""
        kept, self.kept = self.kept, None
        if kept is None or kept[1].is_closing():
            return None
        kept[1].write(messages.RelayTo(leader=address).encode())
        return kept

    def _register(self, term: int) -> None:
        register: dict[str, Any] = {"type": "register", "machine": f"sim-{self.host}"}
        if self.joined and self.generation is not None:
            register.update(generation=self.generation, step=self.step)
            if self.journal_seq in self.process.journals:
                term_of, journal = self.process.journals[self.journal_seq]
                register["journal"] = {
                    "type": "journal",
                    "term": term_of,
                    "seq": self.journal_seq,
                    "journal": journal,
                }
        self.say(register)
        self.joined = True
        stats = self.process.stats
        stats.registered[term] = max(stats.registered.get(term, 0.0), time.time())
        stats.registrations[term] += 1

    async def _follow(self, reader: asyncio.StreamReader) -> None:
        stats = self.process.stats
        first_of_term = True
        while True:
            try:
                line = await reader.readline()
            except (OSError, ValueError):
                return
            if not line:
                return
            if line == messages.LEADER_GONE and self.writer is not None:
                self.kept = (reader, self.writer)
                return
            command = json.loads(line)
            if command.get("term", 0) < self.term:
                continue  # an older leader's: fenced
            self.term = command.get("term", 0)
            now = time.time()
            if first_of_term:
                first_of_term = False
                stats.first_command[self.term] = max(stats.first_command.get(self.term, 0.0), now)
                stats.commanded[self.term] += 1
                self.process.path_cpu("handover", self.term)
            kind = command["type"]
            if kind == "journal":
                seq = command["seq"]
                stats.journal_bytes[seq] += len(line)
                stats.journal_count[seq] += 1
                held = self.journal_seq
                if self.process.hold_journal(command, held):
                    self.journal_seq = seq
            elif kind == "start":
                self.generation, self.training = command["generation"], True
                self.rank, self.progress_every = command["rank"], command.get("progress_every", 1)
                self.held, self.first_report = [], True
                restore = command.get("restore_step")
                self.step = restore or 0
                self.committed = [s for s in self.committed if restore is not None and s <= restore]
                stats.start_last[self.generation] = now
                self.process.path_cpu("round", self.generation)
                stats.start_count[self.generation] += 1
                stats.start_hosts[self.generation].append(self.host)
                if restore is not None:
                    self.say({"type": "restored", "step": restore, "tier": "local", "seconds": 0.0})
                    self.say({"type": "loaded", "generation": self.generation, "step": restore})
            elif kind == "stop":
                generation = command["generation"]
                self.training = False
                self.process.cpu_stop_first.setdefault(generation, time.process_time())
                stats.stop_last[generation] = now
                stats.stop_count[generation] += 1
                stats.stop_hosts[generation].append(self.host)
                self.say({"type": "stopped", "generation": generation, "committed": self.committed})
                stats.ack_last[generation] = time.time()
            elif kind == "activity_request":
                self.say(
                    {
                        "type": "activity",
                        "generation": command["generation"],
                        "step": self.step + 1,
                        "stage": "begun" if self.behind else "work_done",
                        "phase": "idle",
                        "silent_seconds": 0.0,
                        "process": "stopped" if self.behind else "running",
                    }
                )
            elif kind in ("shutdown", "fail"):
                stats.note(f"host {self.host}: {kind} {command.get('reason', '')}")
                self.gone = True
                return
            elif kind in ("park", "retire", "assign"):
                stats.note(f"host {self.host}: {kind}")

    def tick(self) -> None:
        """One step of training ends on this host: reported as `supervisor.host.membership` does,
        every `progress_every` steps (by rank), with the steps held back."""
        if not self.training or self.writer is None:
            return
        self.step += 1
        self.held.append((self.step, time.time(), 0.5))
        if self.first_report or (self.step + self.rank) % self.progress_every == 0:
            self._say_progress()
        if self.step % CHECKPOINT_EVERY == 0:
            self._say_progress()  # any other report says the progress held back first
            self.committed = [*self.committed[-2:], self.step]
            self.say({"type": "checkpoint", "step": self.step})

    def _say_progress(self) -> None:
        if not self.held:
            return
        *earlier, (step, t, work) = self.held
        self.held, self.first_report = [], False
        report = {
            "type": "progress",
            "generation": self.generation,
            "step": step,
            "t": t,
            "loss": 1.0,
            "work": work,
        }
        if earlier:
            report["earlier"] = earlier
        self.say(report)
        self.process.stats.progress_lines += 1
        self.process.stats.progress_steps += 1 + len(earlier)


class MemberProcess:
    def __init__(
        self,
        hosts: range,
        run_dir: Path,
        step_seconds: float,
        hosts_per_relay: int = 0,
        candidates: list[str] | None = None,
    ) -> None:
        self.hosts = {h: SimulatedHost(h, self) for h in hosts}
        self.hosts_per_relay = hosts_per_relay
        """Hosts a relay carries to the leader (groups of consecutive hosts, each within this process;
        0: every host connects to the leader directly)."""
        self.relays: dict[int, tuple[Relay, str]] = {}
        """group -> its relay (supervisor.host.relay, the production code) and the address it serves."""
        self.tls = JobTls(run_dir / "credentials")
        self.stats = Stats()
        self.lease = LeaseWatch(run_dir, self.stats, candidates or [], self.tls)
        self.step_seconds = step_seconds
        self.journals: dict[int, tuple[int, dict[str, Any]]] = {}
        """seq -> the term that wrote it and the journal whole (the same for every replica)."""
        self._connecting = asyncio.Semaphore(CONNECTS_AT_ONCE)
        self.cpu_stop_first: dict[int, float] = {}
        """generation -> this process's CPU time at the first stop of it received."""
        self._cpu_lost: float | None = None
        """This process's CPU time when the first of its hosts lost its leader (None: none has)."""
        self._units = len({h // hosts_per_relay for h in hosts}) if hosts_per_relay else len(hosts)
        """What a machine of its own would run, each: a relay and its members (a host, without relays)."""

    def leader_lost(self) -> None:
        if self._cpu_lost is None:
            self._cpu_lost = time.process_time()

    def path_cpu(self, what: str, key: int) -> None:
        """This process's CPU time on a path, per unit, from its beginning to now (a command that may
        be the path's last here): the round that started generation `key`, the hand-over to term `key`."""
        begun = self.cpu_stop_first.get(key - 1) if what == "round" else self._cpu_lost
        if begun is not None:
            paths = self.stats.path_cpu_round if what == "round" else self.stats.path_cpu_handover
            paths[key] = (time.process_time() - begun) / self._units

    async def connect(
        self, address: str, member: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """`member`'s connection to the leader at `address`: through its group's relay, if any."""
        host, port = address.rsplit(":", 1)
        async with self._connecting:
            try:
                if self.hosts_per_relay:
                    _, relay = self.relays[member // self.hosts_per_relay]
                    return await via_relay(relay, self.tls)(host, int(port))
                return await open_control_connection(host, int(port), self.tls)
            except (OSError, TimeoutError):
                pass
        await asyncio.sleep(RETRY_PAUSE_SECONDS)
        return None

    def hold_journal(self, command: dict[str, Any], held: int | None) -> bool:
        """A journal written on one of this process's hosts, which held journal `held`: True when it
        holds the new one now (a change against another journal is not applied)."""
        seq = command["seq"]
        if seq not in self.journals:
            if command.get("change") is None:
                self.journals[seq] = (command.get("term", 0), command["journal"])
            elif held == command["base"] and held in self.journals:
                base = copy.deepcopy(self.journals[held][1])
                self.journals[seq] = (command.get("term", 0), journal_delta.apply(base, command["change"]))
            else:
                self.stats.note(f"journal {seq}: a change against {command['base']}, {held} held")
                return False
            for old in [kept for kept in self.journals if kept < seq - KEPT_JOURNALS]:
                del self.journals[old]
        return True

    def dump_journals(self, path: Path) -> None:
        """For each term, the first and the last journal its leader wrote on this process's hosts."""
        terms: dict[int, dict[str, Any]] = {}
        for seq, (term, journal) in sorted(self.journals.items()):
            entry = terms.setdefault(term, {"first_seq": seq, "first": journal})
            entry.update(last_seq=seq, last=journal)
        path.write_text(json.dumps({str(term): entry for term, entry in terms.items()}))

    async def clock(self) -> None:
        """Every host of the process ends a step together, every `step_seconds`."""
        next_tick = time.monotonic()
        while True:
            next_tick += self.step_seconds
            await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
            for host in self.hosts.values():
                host.tick()

    async def orders(self) -> None:
        """The driver's requests, from stdin."""
        reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            order = json.loads(line)
            match order["do"]:
                case "fault":
                    host = self.hosts[order["host"]]
                    self.stats.sent[f"fault:{host.host}"] = time.time()
                    fault = {"type": "fault", "generation": host.generation, "kind": order["kind"]}
                    if order["kind"] == "hang":
                        fault.update(detail="no progress (simulated)", silent_seconds=2.0)
                    host.say(fault)
                case "behind":
                    self.hosts[order["host"]].behind = True
                case "lose":
                    host = self.hosts[order["host"]]
                    host.gone = True
                    if host.writer is not None:
                        host.writer.transport.abort()
                case "journals":
                    self.dump_journals(Path(order["path"]))
                    print(json.dumps({"journals": order["path"]}), flush=True)
                case "stats":
                    print(json.dumps({"stats": self.stats.to_json()}), flush=True)
                case "quit":
                    return

    async def run(self) -> None:
        if self.hosts_per_relay:
            for group in sorted({host // self.hosts_per_relay for host in self.hosts}):
                relay = Relay(group, tls=self.tls)
                self.relays[group] = (relay, f"127.0.0.1:{await relay.serve('127.0.0.1')}")
        watch = asyncio.create_task(self.lease.run())
        clock = asyncio.create_task(self.clock())
        hosts = [asyncio.create_task(host.run()) for host in self.hosts.values()]
        await self.orders()
        for task in (watch, clock, *hosts):
            task.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--first", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--step-seconds", type=float, default=1.0)
    parser.add_argument("--hosts-per-relay", type=int, default=0)
    parser.add_argument(
        "--candidates", default="", help="the lease candidates' who-leads addresses, comma-separated (relays)"
    )
    args = parser.parse_args()
    hosts = range(args.first, args.first + args.count)
    candidates = [c for c in args.candidates.split(",") if c]
    process = MemberProcess(hosts, args.run_dir, args.step_seconds, args.hosts_per_relay, candidates)
    asyncio.run(process.run())


if __name__ == "__main__":
    main()
