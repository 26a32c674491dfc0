"""The supervisor of one TPU host: runs the workload, watches it, follows the job's leader.

Per host, one asyncio loop does everything: it listens to the workload's SDK events on a Unix
socket, watches the process (exits) and the clock (hangs), accounts goodput, injects the chaos
faults aimed at this host, serves Prometheus metrics, and obeys the leader's start/stop/shutdown.
The supervisor holding the job's lease also runs the leader (supervisor.leader); any host's may.

A supervisor runs on a machine (`host-i`, or `spare-j` for a spare). A spare registers with the
leader and waits; when a host is lost, the leader assigns it that host's identity and it joins the
next generation as that host, staging the host's shard from a peer (supervisor.checkpoints.tiers).
When the job scales down, the hosts of a dropped slice are `park`ed (idle, accounted as
`scaled_down`) until a scale-up starts them again; a machine being replaced while alive (a
straggler) is told to `retire` and ends.

The supervisor of a machine (`supervisor`: `HostSupervisor`) owns what belongs to the machine and
its process: the event log, metrics, credentials, checkpoint tiers, its part in the election and its
connection to the leader. What it serves is a mode: a spare waiting for a host (`spare`), or one host
(`served_host`), whose parts are built once the host is known, each handed one frozen context
(`context`: the plan, the site, the host's identity, its account, the log and the report):

- `supervisor`: the machine's supervisor: join the leader, follow its commands, the report;
- `spare`: a machine waiting to be assigned a host;
- `served_host`: the parts serving one host, and the leader's commands to a host;
- `context`: what every part serving a host shares, fixed once the host is known;
- `generation`: the restart generation this host is in: start (stage, launch), stop, park;
- `workload`: the workload process, its standby, and its environment (pure functions);
- `workload_starts`: what the workloads start with (the leader's newest start, the machine), and
  when the next standby is pre-started;
- `sdk_events`: the SDK socket, whose word counts, each event's fields checked;
- `sdk_effects`: what each event means (hang timer, culprit, goodput, metrics, the leader);
- `detectors`: the workload's exit classified, its silence judged;
- `chaos`: the chaos faults aimed at this host, for local runs;
- `site`: what differs between a local process and a pod, decided once (addresses, the workload's
  command and environment, the leader's replacements, the pod's annotations);
- `leadership`: this supervisor's part in the election, which leader to follow, and what it does
  while it leads (the term's Leader, the status it publishes);
- `own_leader`: the leader this supervisor runs in a term it holds the lease: made, served, taking
  over;
- `membership`: the connection to whoever leads, rejoined when a leader is lost;
- `machine_record`: what the machine remembers across restarts of its supervisor;
- `host_report`: the supervisor's account at its end.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slicekeeper.supervisor.host.supervisor import HostSupervisor

__all__ = ["HostSupervisor"]


def __getattr__(name: str) -> Any:
    """`HostSupervisor`, imported when first asked for: `slicekeeper run` (the CLI) imports one module
    of this folder (`partition`) and not the supervisor, which its fork server imports instead."""
    if name == "HostSupervisor":
        from slicekeeper.supervisor.host.supervisor import HostSupervisor

        return HostSupervisor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
