"""In local mode a slowed core is no straggler: a host reporting its core is compared with the hosts
sharing it, so a core's slowdown moves a host and its reference together, while a host slow on its
own still stands out.

The timings are synthetic and seeded: 4 hosts pinned to 2 cores as the local run pins them (host h on
core h mod 2), each host's own work per step a base time with lognormal noise, times its core's factor
and its own. The same timelines without the cores are the negative control: that is how the leader
compared hosts before, and what replaced a healthy host of a fault-free run on a virtual machine whose
one vCPU ran 1.5 times slower than the other.
"""

from __future__ import annotations

import random

import pytest
from slicekeeper.supervisor.signals.straggler import Finding, StragglerDetector


def findings(
    *,
    seed: int,
    cores: int = 2,
    report_cores: bool = True,
    slow_core: float = 1.0,
    slow_host: dict[int, float] | None = None,
    steps: int = 200,
    from_step: int = 40,
) -> list[Finding]:
    """The detector's findings on a job whose core 0 (and the hosts of `slow_host`) slow down from
    `from_step` on."""
    rng = random.Random(seed)
    detector = StragglerDetector()
    detector.reset(range(4))
    found: list[Finding] = []
    for step in range(1, steps + 1):
        for host in range(4):
            core = host % cores
            work = 0.05 * rng.lognormvariate(0.0, 0.15)
            if step >= from_step:
                work *= (slow_core if core == 0 else 1.0) * (slow_host or {}).get(host, 1.0)
            found += detector.observe(host, step, work, core=core if report_cores else None)
    return found


@pytest.mark.parametrize("slow_core", [1.5, 2.0, 3.0])
def test_a_core_slowing_down_mid_run_flags_none_of_its_hosts(slow_core: float):
    for seed in range(20):
        assert findings(seed=seed, slow_core=slow_core) == [], seed


@pytest.mark.parametrize("slow_core", [1.5, 2.0])
def test_negative_control_without_the_cores_the_slowed_cores_hosts_are_taken_for_stragglers(
    slow_core: float,
):
    for seed in range(5):
        found = findings(seed=seed, slow_core=slow_core, report_cores=False)
        assert found and {f.host for f in found} <= {0, 2}, (seed, found)


@pytest.mark.parametrize("slow_core", [1.0, 1.5])
def test_a_host_slow_on_its_own_is_found_against_its_core_mate(slow_core: float):
    for seed in range(5):
        found = findings(seed=seed, slow_core=slow_core, slow_host={2: 2.0})
        assert [f.host for f in found] == [2], (seed, found)
        assert found[0].score > 1.6


def test_a_host_alone_on_its_core_is_compared_with_every_other_host():
    # 3 cores: hosts 0 and 3 share core 0, hosts 1 and 2 have one each.
    for seed in range(5):
        assert [f.host for f in findings(seed=seed, cores=3, slow_host={1: 2.0})] == [1], seed


def test_the_cores_are_carried_on_by_a_leader_taking_over():
    detector = StragglerDetector(window=2, warmup=0, persistence=1)
    detector.reset(range(4))
    for host in range(4):
        detector.observe(host, 1, 0.05 * (3 if host % 2 == 0 else 1), core=host % 2)
    successor = StragglerDetector(window=2, warmup=0, persistence=1)
    successor.carry_on(detector.state())
    found = []
    for host in range(4):
        found += successor.observe(host, 2, 0.05 * (3 if host % 2 == 0 else 1))  # cores not said again
    assert found == [] and set(successor.scores().values()) == {1.0}
