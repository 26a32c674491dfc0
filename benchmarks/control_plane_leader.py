"""A leader candidate for the control-plane benchmark: the production election, leader and TLS, no host.

It is what a host's supervisor runs for leadership (`supervisor.host.leadership.Leadership` over the
local lease file, building `supervisor.leader.Leader` for each term it wins, with the job's TLS
credentials and the leader's status publishing), without a workload or a member of its own: the
hosts are simulated by control_plane_members.py. Two of them run per benchmark, as hosts 0 and 1
would: the first takes the lease at once, the other campaigns and takes over when the first is
killed.

`--history K`: the first leader's job memory starts with K faults, their detections, restarts and
policy decisions already behind it, shaped as the real code records them (a long-running job whose
journal has grown), so that what a command costs after a long history can be measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import resource
import signal
import sys
import time
from pathlib import Path

from slicekeeper.supervisor.host import who_leads
from slicekeeper.supervisor.host.leadership import Leadership
from slicekeeper.supervisor.host.relay import Relay
from slicekeeper.supervisor.leader import Leader
from slicekeeper.supervisor.leader.election import (
    CLUSTER_TIMING,
    LEASE_FILE,
    LOCAL_TIMING,
    Election,
    FileLeaseLock,
    Holder,
)
from slicekeeper.supervisor.leader.journal import Detection, FaultRecord
from slicekeeper.supervisor.leader.settings import LeaderSettings
from slicekeeper.supervisor.tls import JobTls

from slicekeeper.chaos import ChaosKind
from slicekeeper.policy.events import FaultKind
from slicekeeper.shape import JobShape

HOSTS_PER_SLICE = 8
"""The simulated job's slices: 8 hosts each (a TPU v4-64 or v5p-64 slice)."""
RESTART_BUDGET = 1_000_000
"""The benchmark restarts the job as often as it likes: no budget runs out."""

ELECTED = "[elected] term"
LEASE_REQUESTS = "[lease] requests"
"""Said every REQUESTS_SAID_SECONDS: the lease requests this candidate made so far, and when."""
REQUESTS_SAID_SECONDS = 0.5
CPU_SAID = "[cpu] seconds"
"""Said every CPU_SAID_SECONDS: this process's CPU time so far, and when (the driver takes the leader's
CPU time on a round's or a hand-over's path from it: control_plane_scale.py, `critical_path_*`)."""
CPU_SAID_SECONDS = 0.05
TIMINGS = {"local": LOCAL_TIMING, "cluster": CLUSTER_TIMING}
"""The lease's timing, by --lease: on the lease file either way."""
"""How this candidate's log says it won a term and when (`ELECTED <term> at <time.time()>`): the
benchmark times a hand-over's rejoining part from it (control_plane_scale.py, `handover_rejoin_s`)."""


def raise_file_limit(wanted: int) -> int:
    """The soft limit on open files raised towards `wanted` (never above the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard, max(soft, wanted))
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


def add_history(leader: Leader, faults: int) -> None:
    """`faults` crashes the job recovered from, each recorded as the leader records one."""
    memory, hosts = leader.memory, leader.world.hosts
    now = time.time() - 3600
    for index in range(faults):
        host = hosts[index % len(hosts)]
        step = 10 * index
        memory.faults.append(
            FaultRecord(
                ChaosKind.KILL,
                host,
                step,
                now,
                index,
                detected_at=now,
                detected_as=FaultKind.CRASH,
                resumed_at=now + 1,
                productive_at=now + 2,
                detected_in_generation=index,
                spec=f"kill:host={host}@step={step}",
            )
        )
        memory.detections.append(
            Detection(FaultKind.CRASH, host, index, now, "exit code 1", restore_step=step)
        )
        memory.restarts[FaultKind.CRASH] += 1
        leader.decisions.records.append(
            {
                "t": now,
                "event": "crash",
                "host": host,
                "step": step,
                "generation": index,
                "action": "restart",
                "reason": "the default policy restarts in place",
            }
        )
    memory.restart = dataclasses.replace(memory.restart, generation=faults)


LAG_SAID_SECONDS = 0.25


async def watch_loop_lag() -> None:
    """Say when the event loop ran late (a lease renewal waits on it: a second late, it is fenced)."""
    while True:
        before = time.monotonic()
        await asyncio.sleep(0.1)
        late = time.monotonic() - before - 0.1
        if late > LAG_SAID_SECONDS:
            print(
                f"[loop {time.strftime('%H:%M:%S')}] the event loop ran {late:.2f} s late",
                file=sys.stderr,
                flush=True,
            )


async def say_requests(leadership: Leadership) -> None:
    """The lease requests so far, every REQUESTS_SAID_SECONDS (the driver counts them per phase)."""
    while True:
        said = f"{LEASE_REQUESTS} {leadership.lease_requests} at {time.time():.6f}"
        print(said, file=sys.stderr, flush=True)
        await asyncio.sleep(REQUESTS_SAID_SECONDS)


async def say_cpu() -> None:
    """The process's CPU time so far, every CPU_SAID_SECONDS (the driver interpolates between them)."""
    while True:
        print(f"{CPU_SAID} {time.process_time():.6f} at {time.time():.6f}", file=sys.stderr, flush=True)
        await asyncio.sleep(CPU_SAID_SECONDS)


async def campaign(args: argparse.Namespace) -> None:
    shape = JobShape(args.hosts // HOSTS_PER_SLICE, HOSTS_PER_SLICE)
    own = Holder(f"leader-{args.host}", args.host, f"127.0.0.1:{args.port}")
    first_term = [True]

    def new_leader(term: int, leading: object) -> Leader:
        print(f"{ELECTED} {term} at {time.time():.6f}", file=sys.stderr, flush=True)
        leader = Leader(
            LeaderSettings(
                shape, RESTART_BUDGET, max_restarts_without_progress=RESTART_BUDGET, log_events=True
            ),
            lambda generation, rank0: "127.0.0.1:1",
            term=term,
            leading=leading,  # type: ignore[arg-type]
        )
        if first_term[0] and args.history:
            add_history(leader, args.history)
        first_term[0] = False
        return leader

    leadership = Leadership(
        Election(FileLeaseLock(args.run_dir / LEASE_FILE, own.identity()), TIMINGS[args.lease]),
        own,
        candidate=True,
        first=args.first,
        new_leader=new_leader,
        journal=lambda: None,
        bind="127.0.0.1",
        tls=JobTls(args.run_dir / "credentials"),
    )
    if args.who_leads_port:  # the relay port of a candidate's supervisor answers who leads
        desk = Relay(-1, tls=leadership.tls)
        desk.lease_seen = lambda: who_leads.seen(leadership.lease)
        await desk.serve("127.0.0.1", args.who_leads_port)
    said = asyncio.create_task(say_requests(leadership))
    cpu = asyncio.create_task(say_cpu())
    publishing: list[asyncio.Task[None]] = []
    leadership.elected = lambda leader: publishing.append(asyncio.ensure_future(leader.publish_status()))
    lag = asyncio.create_task(watch_loop_lag())
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    running = asyncio.create_task(leadership.run())
    await stop.wait()
    running.cancel()
    lag.cancel()
    said.cancel()
    cpu.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--hosts", type=int, required=True)
    parser.add_argument("--host", type=int, required=True, help="the host this candidate serves (0: first)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--first", action="store_true", help="take the lease at once")
    parser.add_argument("--who-leads-port", type=int, default=0, help="answer who leads there (relays)")
    parser.add_argument("--lease", choices=sorted(TIMINGS), default="local")
    parser.add_argument("--history", type=int, default=0)
    parser.add_argument(
        "--connections", type=int, default=None, help="members' connections it holds (default: one a host)"
    )
    args = parser.parse_args()
    connections = args.hosts if args.connections is None else args.connections
    limit = raise_file_limit(connections + 256)
    if limit < connections + 64:
        sys.exit(f"{connections} connections need {connections + 64} open files; this machine allows {limit}")
    asyncio.run(campaign(args))


if __name__ == "__main__":
    main()
