"""The end-of-run report: job-level goodput, badput by category, restarts, faults, fingerprint.

Built from what each host's supervisor accounted and what the leader recorded. Job-level seconds
are the mean over hosts, so `goodput + sum(badput_seconds) / wall_seconds == 1` (and the same holds
for each host's own figures); time a host did not account for (the runtime starting and stopping
supervisors) counts as `other`. After a hot-swap a host identity was served by two machines (the
lost one, then the spare): their accounts are added up, and so are the accounts of a supervisor that
crashed and of the one started again after it. A spare that was never needed is not a host of the
job and does not count. Reads from the persistent tier are the tier's own counts, from every
machine's supervisor, not the restores' labels.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from typing import Any

from slicekeeper.goodput import BADPUT, Category, ideal_step_seconds
from slicekeeper.recovery_breakdown import breakdown_line


def _relative(value: float | None, start: float) -> float | None:
    return None if value is None else round(value - start, 3)


def merge_machines(machines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One account per host identity, in host order, from the reports of the machines that served it."""
    by_host: dict[int, list[dict[str, Any]]] = {}
    for report in machines:
        if report.get("host") is not None:
            by_host.setdefault(int(report["host"]), []).append(report)
    merged = []
    for host in sorted(by_host):
        # the machines that left (lost or replaced while alive) and supervisors that crashed first,
        # the one serving at the end last
        parts = sorted(
            by_host[host],
            key=lambda r: bool(r.get("lost") or r.get("retired") or r.get("crashed")),
            reverse=True,
        )
        last = parts[-1]
        merged.append(
            {
                **last,
                "machines": [r.get("machine") for r in parts],
                "wall_seconds": sum(r["wall_seconds"] for r in parts),
                "seconds": {k: sum(r["seconds"].get(k, 0.0) for r in parts) for k in last["seconds"]},
                "productive_step_seconds": [d for r in parts for d in r.get("productive_step_seconds", [])],
                "restarts": _added_up(r.get("restarts") or {} for r in parts),
                "faults": _added_up(r.get("faults") or {} for r in parts),
            }
        )
    return merged


def _added_up(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for count in counts:
        total.update(count)
    return dict(total)


def _host_badput(host: dict[str, Any], wall_seconds: float) -> dict[str, float]:
    """One host's badput seconds; the wall time it did not account for is `other`, as for the job."""
    badput = {c.value: host["seconds"].get(c.value, 0.0) for c in BADPUT}
    badput[Category.OTHER.value] += max(0.0, wall_seconds - host["wall_seconds"])
    return {k: round(v, 3) for k, v in badput.items()}


def store_reads(machines: list[dict[str, Any]]) -> dict[str, int]:
    """What every machine's supervisor read from the persistent tier, as the tier counted it."""
    total = {"shards": 0, "objects": 0, "bytes": 0}
    for report in machines:
        for key, value in (report.get("persistent_reads") or {}).items():
            total[key] = total.get(key, 0) + int(value)
    return total


def build_report(
    *,
    job_name: str,
    started_at: float,
    wall_seconds: float,
    summary: dict[str, Any],
    hosts: list[dict[str, Any]],
) -> dict[str, Any]:
    reads = store_reads(hosts)
    hosts = merge_machines(hosts)
    productive = [h["seconds"][Category.PRODUCTIVE.value] for h in hosts]
    badput: dict[str, float] = {}
    for category in BADPUT:
        badput[category.value] = (
            statistics.fmean(h["seconds"][category.value] for h in hosts) if hosts else 0.0
        )
    unaccounted = (
        statistics.fmean(max(0.0, wall_seconds - h["wall_seconds"]) for h in hosts) if hosts else wall_seconds
    )
    badput[Category.OTHER.value] += unaccounted
    fingerprints = list(summary.get("fingerprints", {}).values())
    agreed = fingerprints[0] if fingerprints and len(set(fingerprints)) == 1 else None
    faults = []
    for fault in summary.get("faults", []):
        fired, detected, resumed = fault["fired_at"], fault.get("detected_at"), fault.get("resumed_at")
        faults.append(
            {
                "kind": fault["kind"],
                "host": fault["host"],
                "step": fault["step"],
                "fired_at": _relative(fired, started_at),
                "detected_as": fault.get("detected_as"),
                "detected_at": _relative(detected, started_at),
                "resumed_at": _relative(resumed, started_at),
                "productive_at": _relative(fault.get("productive_at"), started_at),
                "detection_seconds": None if detected is None else round(detected - fired, 3),
                "recovery_seconds": None
                if resumed is None or detected is None
                else round(resumed - detected, 3),
                "detail": fault.get("detail", ""),
            }
        )
    all_steps = [d for h in hosts for d in h.get("productive_step_seconds", [])]
    restores = summary.get("restores", [])
    swaps = summary.get("hot_swaps", [])
    return {
        "job": job_name,
        "state": summary.get("state", "unknown"),
        "failure_reason": summary.get("failure_reason"),
        "steps_completed": summary.get("steps_completed", 0),
        "goodput": round(statistics.fmean(productive) / wall_seconds, 4)
        if hosts and wall_seconds > 0
        else 0.0,
        "badput_seconds": {k: round(v, 3) for k, v in badput.items()},
        "productive_seconds": round(statistics.fmean(productive), 3) if hosts else 0.0,
        "restarts": summary.get("restarts", {}),
        "faults": faults,
        "detections": [
            {**d, "detected_at": _relative(d["detected_at"], started_at)}
            for d in summary.get("detections", [])
        ],
        "params_fingerprint": agreed,
        "ideal_step_seconds": ideal_step_seconds(all_steps),
        "wall_seconds": round(wall_seconds, 3),
        "started_at": round(started_at, 3),
        "generations": summary.get("generations", 1),
        "restores": [
            r if "hosts" in r else {k: r.get(k) for k in _RESTORE_FIELDS}  # summed up, or per host
            for r in restores
        ],
        "recoveries": [
            {**r, "stopped_at": _relative(r.get("stopped_at"), started_at)}
            for r in summary.get("recoveries", [])
        ],
        "persistent_reads": reads["shards"],
        "persistent_read_bytes": reads["bytes"],
        "hot_swaps": {
            "count": len(swaps),
            "hosts": [s["host"] for s in swaps],
            "details": swaps,
        },
        "leader_changes": [
            {**c, "at": _relative(c["at"], started_at)} for c in summary.get("leader_changes", [])
        ],
        "failed_saves": summary.get("failed_saves", {}),
        "decisions": [{**d, "t": _relative(d["t"], started_at)} for d in summary.get("decisions", [])],
        "announced_losses": announced_losses(summary.get("decisions", [])),
        "stragglers": [{**s, "t": _relative(s["t"], started_at)} for s in summary.get("stragglers", [])],
        "world": [{**w, "t": _relative(w["t"], started_at)} for w in summary.get("world", [])],
        "scale_events": [{**e, "t": _relative(e["t"], started_at)} for e in summary.get("scale_events", [])],
        "persistent_checkpoints": summary.get("persistent_committed", []),
        "persistent_commits": [
            {**c, "t": _relative(c["t"], started_at)} for c in summary.get("persistent_commits", [])
        ],
        "hosts": [
            {
                "host": h["host"],
                "slice": h["slice"],
                "worker": h["worker"],
                "exit_code": h.get("exit_code"),
                "goodput": round(h["seconds"][Category.PRODUCTIVE.value] / wall_seconds, 4)
                if wall_seconds
                else 0.0,
                "productive_seconds": round(h["seconds"][Category.PRODUCTIVE.value], 3),
                "badput_seconds": _host_badput(h, wall_seconds),
                "restarts": h.get("restarts", {}),
                "faults": h.get("faults", {}),
                "last_checkpoint_step": h.get("last_checkpoint_step"),
                "typical_step_seconds": h.get("typical_step_seconds"),
                "machines": h.get("machines", []),
            }
            for h in hosts
        ],
    }


_RESTORE_FIELDS = ("host", "step", "tier", "holder", "generation", "seconds", "loaded_step")
"""A restore's fields in the report, where the job kept its restores per host."""


def _recovery_line(recovery: dict[str, Any], restores: list[dict[str, Any]]) -> str:
    """`generation 2: hang on host 0 -> step 75 (host 2 peer, others local), 4 steps again`."""
    mine = [r for r in restores if r["generation"] == recovery["generation"]]
    summed_up = [r for r in mine if "hosts" in r]  # a large world's (supervisor.leader.restart_records)
    tiers = {r["host"]: r.get("tier") for r in mine if "host" in r}
    counts = Counter(tiers.values())
    common = counts.most_common(1)[0][0] if counts else None
    if summed_up:
        counts = Counter(summed_up[-1]["tiers"])
        sources = ", ".join(f"{tier} {shards}" for tier, shards in counts.most_common())
    elif len(counts) == 1:
        sources = f"all {common}"
    elif counts[common] > 1:
        odd = ", ".join(f"host {h} {t}" for h, t in sorted(tiers.items()) if t != common)
        sources = f"{odd}, others {common}"
    else:
        sources = ", ".join(f"host {h} {t}" for h, t in sorted(tiers.items()))
    cause = recovery.get("cause") or "restart"
    if recovery.get("host") is not None:
        cause += f" on host {recovery['host']}"
    restored = (
        "from scratch" if recovery["restore_step"] is None else f"step {recovery['restore_step']} ({sources})"
    )
    return (
        f"  generation {recovery['generation']:<7}{cause} -> {restored}, "
        f"{recovery['steps_replayed']} step(s) again"
    )


def announced_losses(decisions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The losses announced ahead (a maintenance, a preemption), each as decided on: the step saved
    on the notice (None: not in time, the unannounced path) and what the policy did."""
    return [
        {
            "host": d["event"]["host"],
            "cause": d["event"]["cause"],
            "source": d["event"].get("source", ""),
            "seconds_left": d["event"]["seconds_left"],
            "saved_step": d["event"].get("saved_step"),
            "action": d["action"]["name"],
        }
        for d in decisions
        if d["event"]["kind"] == "announced_loss"
    ]


def _announced_line(loss: dict[str, Any]) -> str:
    saved = (
        f"step {loss['saved_step']} saved on every host first"
        if loss["saved_step"] is not None
        else "no step saved in time: the unannounced path (the newest earlier checkpoint restored)"
    )
    return (
        f"  announced loss    {loss['cause']} of host {loss['host']} ({loss['source']}): {saved}; "
        f"{loss['action']} with {loss['seconds_left']:.1f} s left"
    )


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"job {report['job']}: {report['state']}"
        + (f" ({report['failure_reason']})" if report.get("failure_reason") else ""),
        f"  steps completed   {report['steps_completed']}",
        f"  wall time         {report['wall_seconds']:.1f} s",
        f"  goodput           {report['goodput']:.3f}",
    ]
    if report.get("ideal_step_seconds"):
        lines.append(f"  ideal step time   {report['ideal_step_seconds'] * 1000:.0f} ms")
    restarts = ", ".join(f"{k} {v}" for k, v in report["restarts"].items()) or "none"
    lines.append(f"  restarts          {restarts}")
    lines.append("  badput (s)")
    for category, seconds in sorted(report["badput_seconds"].items(), key=lambda kv: -kv[1]):
        if seconds >= 0.05:
            lines.append(f"    {category:<24}{seconds:8.2f}")
    for fault in report["faults"]:
        detected = (
            f"detected as {fault['detected_as']} after {fault['detection_seconds']:.2f} s"
            if fault["detection_seconds"] is not None
            else fault.get("detail") or "not detected"
        )
        recovered = (
            f", training again {fault['recovery_seconds']:.2f} s later"
            if fault["recovery_seconds"] is not None
            else ""
        )
        where = f" host {fault['host']}" if fault["host"] >= 0 else ""
        lines.append(f"  fault {fault['kind']}{where} @ step {fault['step']}: {detected}{recovered}")
        if parts := breakdown_line(fault.get("breakdown")):
            lines.append(f"    recovery (s, slowest host each): {parts}")
    lines.extend(_announced_line(loss) for loss in report.get("announced_losses", []))
    if report.get("hot_swaps", {}).get("count"):
        swapped = ", ".join(f"host {s['host']} -> {s['machine']}" for s in report["hot_swaps"]["details"])
        lines.append(f"  hot-swaps         {report['hot_swaps']['count']} ({swapped})")
    for change in report.get("leader_changes", []):
        lines.append(
            f"  leader change     at {change['at']:.1f} s: host {change['from_host']} "
            f"({change['from_machine']}) -> host {change['to_host']} ({change['to_machine']}), "
            f"term {change['term']}, {change['leaderless_seconds']:.1f} s without a leader"
        )
    for recovery in report.get("recoveries", []):
        lines.append(_recovery_line(recovery, report.get("restores", [])))
    if report.get("restores"):
        lines.append(
            f"  restores          {sum(r.get('hosts', 1) for r in report['restores'])} shard(s), "
            f"{report['persistent_reads']} read from the persistent tier"
        )
    for straggler in report.get("stragglers", []):
        lines.append(
            f"  straggler         host {straggler['host']} score {straggler['score']:.2f} "
            f"(found at step {straggler['step']})"
        )
    for scale in report.get("scale_events", []):
        lines.append(
            f"  scale-{scale['kind']:<11} step {scale['step']}: "
            f"{scale['from_hosts']} -> {scale['to_hosts']} hosts (slices {scale['to_slices']})"
        )
    if report.get("decisions"):
        lines.append("  decisions")
        for decision in report["decisions"]:
            event = decision["event"]
            on = f" host {event['host']}" if event.get("host") is not None else ""
            lines.append(
                f"    step {decision['step']:>5}  {event['kind']}{on} -> "
                f"{decision['action']['name']} ({decision['source']})"
            )
    if report.get("failed_saves"):
        failed = ", ".join(f"{tier} {count}" for tier, count in report["failed_saves"].items())
        lines.append(f"  failed copies     {failed}")
    if report.get("params_fingerprint"):
        lines.append(f"  params fingerprint {report['params_fingerprint'][:16]}...")
    return "\n".join(lines)
