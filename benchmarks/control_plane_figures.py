"""The control-plane benchmark's figures: what one run measured, the medians over runs, the targets
(issue 41's, at 25,000 hosts) and the table (benchmarks/control_plane_scale.py runs the processes and
measures)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any


@dataclass
class RunFigures:
    hosts: int
    leader_cpu_share: float
    cpu_per_host_step_us: float
    culprit_s: float
    restart_rounds_s: list[float]
    stop_s: list[float]
    acks_s: list[float]
    journal_bytes_per_command: list[int]
    handover_s: float
    handover_registered_s: float
    handover_rejoin_s: float
    peak_rss_mib: float
    leader_connections: int
    api_requests_per_second_at_rest: float
    """Lease requests a second in the steady state: the candidates', and the members' own reads
    (none through relays: they ask the candidates)."""
    api_requests_in_handover: int
    """Lease requests from the leader's kill to every host registered with the next one."""
    critical_path_rounds_s: list[float]
    """Each restart round as it would take with each process on a machine of its own: the leader's
    CPU time from the crash report to its last start, plus the most CPU time any member process
    spent per relay from its first stop to its last start (control_plane_scale.py, "The critical
    path")."""
    critical_path_rounds_leader_s: list[float]
    """Of each: the leader's CPU time."""
    critical_path_handover_s: float
    """The hand-over the same way: the lease's wait (the kill to the next leader's election, on the
    wall clock), the new leader's CPU time from its election to its last first command, and the most
    CPU time any member process spent per relay from its leader's loss to its last first command."""


def summarize(runs: list[RunFigures]) -> dict[str, Any]:
    """One JSON line for a size: medians over runs (and over every round of every run)."""

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 4)

    every = lambda name: [value for run in runs for value in getattr(run, name)]  # noqa: E731
    journal = every("journal_bytes_per_command")
    return {
        "hosts": runs[0].hosts,
        "runs": len(runs),
        "restart_round_s": median(every("restart_rounds_s")),
        "restart_round_max_s": round(max(every("restart_rounds_s")), 4),
        "critical_path_round_s": median(every("critical_path_rounds_s")),
        "critical_path_round_leader_s": median(every("critical_path_rounds_leader_s")),
        "stop_s": median(every("stop_s")),
        "acks_s": median(every("acks_s")),
        "handover_s": median([run.handover_s for run in runs]),
        "handover_registered_s": median([run.handover_registered_s for run in runs]),
        "handover_rejoin_s": median([run.handover_rejoin_s for run in runs]),
        "critical_path_handover_s": median([run.critical_path_handover_s for run in runs]),
        "leader_cpu_share": median([run.leader_cpu_share for run in runs]),
        "leader_cpu_per_host_step_us": median([run.cpu_per_host_step_us for run in runs]),
        "journal_bytes_per_command": int(statistics.median(journal)) if journal else 0,
        "journal_bytes_per_command_max": max(journal) if journal else 0,
        "culprit_s": median([run.culprit_s for run in runs]),
        "peak_rss_mib": median([run.peak_rss_mib for run in runs]),
        "leader_connections": max(run.leader_connections for run in runs),
        "api_requests_per_second_at_rest": median([run.api_requests_per_second_at_rest for run in runs]),
        "api_requests_in_handover": int(statistics.median([run.api_requests_in_handover for run in runs])),
    }


TARGETS = {
    "restart_round_s": ("restart round (s)", 2.0),
    "critical_path_round_s": ("round, a machine per process (s)", 0.5),
    "critical_path_round_leader_s": ("of which: the leader's CPU (s)", None),
    "handover_s": ("hand-over (s)", 10.0),
    "handover_rejoin_s": ("of which: elected -> all registered", None),
    "critical_path_handover_s": ("hand-over, a machine per process", 5.0),
    "leader_cpu_share": ("leader share of a core", 0.1),
    "leader_cpu_per_host_step_us": ("leader CPU per host-step (us)", None),
    "journal_bytes_per_command": ("journal bytes per command, median", 64 << 10),
    "journal_bytes_per_command_max": ("journal bytes per command, most", 1 << 20),
    "culprit_s": ("culprit named (s)", 1.5),
    "peak_rss_mib": ("leader peak memory (MiB)", 512),
    "leader_connections": ("leader's open connections", 500),
    "api_requests_per_second_at_rest": ("lease requests a second, at rest", 2.0),
    "api_requests_in_handover": ("lease requests in the hand-over", 100),
}


def misses(lines: list[dict[str, Any]]) -> list[str]:
    """Each figure over its target, named with the size it was measured at."""
    return [
        f"{label} at {line['hosts']:,} hosts: {line[key]:,} over the target {target:,}"
        for line in lines
        for key, (label, target) in TARGETS.items()
        if target is not None and line[key] > target
    ]


def table(lines: list[dict[str, Any]]) -> str:
    header = f"{'':34}" + "".join(f"{line['hosts']:>12,}" for line in lines) + f"{'target':>12}"
    rows = [header]
    for key, (label, target) in TARGETS.items():
        cells = "".join(
            f"{line[key]:>12,.3f}" if isinstance(line[key], float) else f"{line[key]:>12,}" for line in lines
        )
        rows.append(f"{label:34}{cells}{'' if target is None else f'{target:>12,}'}")
    return "\n".join(rows)
