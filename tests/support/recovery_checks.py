"""What "nothing lost" means, checked on a run's report: the chaos acceptance runs' shared checks.

A faulty run that ends with the parameters of a fault-free run has lost nothing, but the fingerprint
alone cannot tell a job that restored the newest checkpoint from one that silently went back further
(data is a function of the step, so it replays the difference) or started again from scratch. So
every restart is checked on its own, from what the report records of it:

- the step restored is the newest step every host of the world could restore from what the job held
  when it stopped (recomputed here from the holdings, independently of the leader's restore plan);
- every host of the world staged that step, and its workload loaded exactly that step (or, in a
  generation stopped again before it said so, nothing);
- the steps executed again are the ones between the restore and the job's high-water mark;
- no host of a restart compiled a program again when its world (the hosts taking part) ran before:
  a restart, a hot-swap or a return to an earlier size loads what was compiled (the workloads say
  which programs they loaded and compiled; the report lists it per fault and host).

`problems()` returns each violation as a sentence (empty: none), so a test can assert it is empty
and a negative control (tests/fixtures/misrestoring_trainer.py) can assert which one it found.
"""

from __future__ import annotations

from typing import Any


def _steps(values: Any) -> set[int]:
    return {int(step) for step in values}


def newest_restorable_step(held: dict[str, Any], world: list[int], hosts_per_slice: int) -> int | None:
    """The newest step of which every host of `world` has a valid copy somewhere: its own local tier,
    a replica on a live peer, or a committed persistent step holding its shard. A host rejoining after
    a scale-down may use its twins' copies (the same worker in other slices)."""
    live = _steps(held["live"])
    local = {int(h): _steps(s) for h, s in held["local"].items()}
    replicas = {
        int(holder): {int(owner): _steps(s) for owner, s in owners.items()}
        for holder, owners in held["replicas"].items()
    }
    persistent = {int(step): _steps(owners) for step, owners in held["persistent"].items()}
    invalid = {int(h): _steps(s) for h, s in held["invalid"].items()}
    job_invalid = _steps(held["job_invalid"])
    rejoining = _steps(held["rejoining"])

    def own_copy(owner: int, step: int, restorer: int) -> bool:
        if step in invalid.get(owner, set()):
            return False
        if step in local.get(owner, set()) and (owner == restorer or owner in live):
            return True
        for holder, owners in replicas.items():
            if holder not in (owner, restorer) and holder in live and step in owners.get(owner, set()):
                return True
        return owner in persistent.get(step, set())

    def restorable(host: int, step: int) -> bool:
        if step in job_invalid:
            return False
        owners = [host]
        if host in rejoining:
            worker = host % hosts_per_slice
            owners += [t for t in world if t % hosts_per_slice == worker and t != host and t not in rejoining]
        return any(own_copy(owner, step, host) for owner in owners)

    candidates: set[int] = set(persistent)
    for steps in local.values():
        candidates |= steps
    for owners in replicas.values():
        for steps in owners.values():
            candidates |= steps
    for step in sorted(candidates, reverse=True):
        if all(restorable(host, step) for host in world):
            return step
    return None


def problems(
    report: dict[str, Any],
    *,
    hosts_per_slice: int = 2,
    fingerprint: str | None = None,
    steps: int | None = None,
) -> list[str]:
    """Every way the run falls short of "nothing lost"; empty when it does not."""
    found: list[str] = []
    if report["state"] != "succeeded":
        found.append(f"the job ended {report['state']}: {report.get('failure_reason')}")
    if steps is not None and report["steps_completed"] != steps:
        found.append(f"{report['steps_completed']} steps completed, not {steps}")
    if fingerprint is not None and report["params_fingerprint"] != fingerprint:
        found.append(
            f"final parameters {report['params_fingerprint']} differ from the fault-free run's {fingerprint}"
        )
    restarts = sum(report["restarts"].values())
    recoveries = [r for r in report["recoveries"] if r["cause"] != "resume"]
    if len(recoveries) != restarts:
        found.append(f"{restarts} restart(s) but {len(recoveries)} recorded restore(s)")
    for number, recovery in enumerate(report["recoveries"]):
        last = number == len(report["recoveries"]) - 1
        found += _recovery_problems(report, recovery, hosts_per_slice, last=last)
    return found + compiled_again(report)


def compiled_again(report: dict[str, Any]) -> list[str]:
    """Each host that compiled programs at a restart into a world that had run before, by the
    workload's ProgramCache lists and, independently, by the framework's own compile events
    (`backend_compiles`, JAX's); and, where the workload says what it compiled at all, each host of a
    restart that did not say it."""
    worlds = {r["generation"]: tuple(sorted(r["world"])) for r in report["recoveries"]}
    every_host = tuple(sorted(h["host"] for h in report["hosts"]))
    restarted = [
        host for fault in report["faults"] for host in (fault.get("breakdown") or {}).get("hosts", [])
    ]
    says = any("loaded" in host or "compiled" in host for host in restarted)
    found = []
    for host in restarted:
        generation = host["generation"]
        world = worlds.get(generation)
        earlier = {every_host} | {w for g, w in worlds.items() if g < generation}
        if says and "loaded" not in host and "compiled" not in host:
            found.append(f"generation {generation}: host {host['host']} never said what it compiled")
        if world not in earlier:
            continue
        if host.get("compiled"):
            found.append(
                f"generation {generation}: host {host['host']} compiled {host['compiled']} again "
                f"(world {list(world or ())} ran before)"
            )
        if host.get("backend_compiles"):
            found.append(
                f"generation {generation}: host {host['host']}'s framework compiled "
                f"{host['backend_compiles']} program(s) again ({', '.join(host.get('backend_compiled', []))})"
            )
    return found


def _recovery_problems(
    report: dict[str, Any], recovery: dict[str, Any], hosts_per_slice: int, *, last: bool
) -> list[str]:
    generation, step = recovery["generation"], recovery["restore_step"]
    where = f"generation {generation} ({recovery['cause']})"
    found = []
    newest = newest_restorable_step(recovery["held"], recovery["world"], hosts_per_slice)
    if step != newest:
        found.append(f"{where} restored step {step}, but the newest step every host held was {newest}")
    if recovery["steps_replayed"] != recovery["high_water"] - (step or 0):
        found.append(f"{where}: {recovery['steps_replayed']} steps counted again after {step}")
    if step is None:
        return found  # from scratch: nobody stages or loads anything
    staged = {r["host"]: r for r in report["restores"] if r["generation"] == generation}
    for host in recovery["world"]:
        restore = staged.get(host)
        if restore is None:
            found.append(f"{where}: host {host} restored nothing")
            continue
        if restore["step"] != step:
            found.append(f"{where}: host {host} staged step {restore['step']}, not the agreed {step}")
        loaded = restore["loaded_step"]
        # A generation stopped early may end before a workload said what it loaded; the generation
        # that finished the job must have every host's word.
        if loaded != step and (loaded is not None or last):
            found.append(f"{where}: host {host}'s workload loaded step {loaded}, not {step}")
    return found


def tiers(report: dict[str, Any], generation: int) -> dict[int, str]:
    """Host -> the tier it restored from in `generation`."""
    return {r["host"]: r["tier"] for r in report["restores"] if r["generation"] == generation}


def recovery_summary(report: dict[str, Any]) -> list[tuple[str, int | None, int]]:
    """(cause, restore step, steps executed again) of each restart, in order."""
    return [(r["cause"], r["restore_step"], r["steps_replayed"]) for r in report["recoveries"]]


def detected_on(report: dict[str, Any]) -> list[int | None]:
    """The host whose supervisor reported each restart's fault first (for a hang, any host: every
    host of a stalled collective stops making progress)."""
    return [r["host"] for r in report["recoveries"]]
