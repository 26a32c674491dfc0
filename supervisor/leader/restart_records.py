"""What a restart leaves in the job's memory about each host, at a size the journal can carry.

Every start from a checkpoint records the world it started and what every host held then (a
recovery), and every host's restore: the step and tier staged, the step its workload loaded. The
report and the recovery checks read these per host, and in a job of a few hosts that is what they
are. At thousands of hosts they would be most of the journal: one restart of 1,000 hosts added 127 KB
of restores and 22 KB of recovery to the change sent to each journal replica
(benchmarks/control_plane_scale.py), about 19 MB for one command at 25,000 hosts and five replicas.

So above `PER_HOST_UP_TO` hosts the same records are summed up:
- a recovery's world and live hosts as runs ("0-24999", slicekeeper.shape.host_ranges), and what the
  hosts held as the number of hosts holding each step, by tier;
- the restores of a generation as one record (`hosts` staged, their `step`, counts per tier, bytes in
  all, the slowest seconds, how many loaded the step staged) with the hosts that stand out in
  `unlike` (another step staged or loaded), each as the per-host record it would have been.
What a command costs then no longer grows with the job's size.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from slicekeeper.shape import host_ranges

PER_HOST_UP_TO = 256
"""The largest world whose restart records are kept per host."""


def per_host(world_hosts: int) -> bool:
    """Whether a world of this many hosts keeps its restart records per host."""
    return world_hosts <= PER_HOST_UP_TO


def world(hosts: list[int]) -> list[int] | str:
    """A recovery's world: the hosts, or their runs above `PER_HOST_UP_TO`."""
    return list(hosts) if per_host(len(hosts)) else host_ranges(hosts)


def held(holdings: dict[str, Any], world_hosts: int) -> dict[str, Any]:
    """What the hosts held at a stop (supervisor.leader.checkpoints.Checkpoints.held), summed up per
    step above `PER_HOST_UP_TO` hosts: `local` and `replicas` count the hosts holding each step (a
    replica's owner counted once however many hold it), `persistent` the owners of each step's shards."""
    if per_host(world_hosts):
        return holdings
    local: Counter[str] = Counter()
    for steps in holdings["local"].values():
        local.update(str(step) for step in steps)
    replicated: dict[str, set[str]] = {}
    for owners in holdings["replicas"].values():
        for owner, steps in owners.items():
            for step in steps:
                replicated.setdefault(str(step), set()).add(owner)
    return {
        "summed_up": True,
        "live": host_ranges(holdings["live"]),
        "local": {step: local[step] for step in sorted(local, key=int)},
        "replicas": {step: len(replicated[step]) for step in sorted(replicated, key=int)},
        "persistent": {step: len(owners) for step, owners in holdings["persistent"].items()},
        "invalid": holdings["invalid"],
        "job_invalid": holdings["job_invalid"],
        "rejoining": host_ranges(holdings["rejoining"]),
    }


def _summary(restores: list[dict[str, Any]], generation: int) -> dict[str, Any] | None:
    """The summed-up restores of `generation`: the last record, as every restore of a generation
    summed up is counted in it (None when the last record is another's, or kept per host)."""
    last = restores[-1] if restores else None
    return last if last is not None and "hosts" in last and last["generation"] == generation else None


def staged(restores: list[dict[str, Any]], restore: dict[str, Any], world_hosts: int) -> None:
    """A host's shard was staged for its restore: `restore` (the per-host record) kept, or counted."""
    if per_host(world_hosts):
        restores.append(restore)
        return
    summary = _summary(restores, restore["generation"])
    if summary is None:
        summary = {
            "generation": restore["generation"],
            "hosts": 0,
            "step": restore["step"],
            "tiers": {},
            "bytes": 0,
            "seconds": 0.0,
            "loaded": 0,
            "unlike": [],
        }
        restores.append(summary)
    summary["hosts"] += 1
    summary["tiers"][restore["tier"]] = summary["tiers"].get(restore["tier"], 0) + 1
    summary["bytes"] += restore.get("bytes") or 0
    summary["seconds"] = max(summary["seconds"], restore.get("seconds") or 0.0)
    if restore["step"] != summary["step"]:
        summary["unlike"].append(restore)


def loaded(restores: list[dict[str, Any]], host: int, generation: int, step: int | None) -> bool:
    """A workload loaded `step` in a generation whose restores are summed up: counted when it is the
    step staged, or its host kept among the hosts that stand out. False when the generation's restores
    are kept per host (or none was staged in it)."""
    summary = _summary(restores, generation)
    if summary is None:
        return False
    unlike = next((record for record in summary["unlike"] if record["host"] == host), None)
    if unlike is not None:
        unlike["loaded_step"] = step
    elif step == summary["step"]:
        summary["loaded"] += 1
    else:
        summary["unlike"].append(
            {"host": host, "step": summary["step"], "tier": None, "holder": None, "generation": generation}
            | {"loaded_step": step}
        )
    return True
