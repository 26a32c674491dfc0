"""The policy benchmark's scenarios (benchmarks/policy.py): which fault, on which host, at which step,
and the targets each is held to.

The runner, the figures of a run and the table all name the same scenarios; they are defined here once.
"""

from __future__ import annotations

from dataclasses import dataclass

SLOW_HOST = 2
SLOW_STEP = 30
FLAG_TARGET_STEPS = {1.5: 30, 2.0: 15}
"""Slowdown factor -> steps after the slowdown within which the slow host must be flagged."""
LOST_HOST = 3
LOSE_STEP = 40
SCALE_DOWN_TARGET_SECONDS = 20.0
SCALE_DOWN_HOSTS = (4, 2)
HEALTHY_MINUTES = 5.0
HEALTHY_MARGIN = 1.15
"""Healthy steps = margin x the wanted training time / step time: steps vary with the machine's load."""
FALLBACK_STEP_SECONDS = 0.5
"""Step time assumed for the healthy run's length when no slow run measured one."""


@dataclass(frozen=True)
class Scenario:
    key: str
    chaos: str | None
    factor: float | None = None


def slow_scenario(factor: float) -> Scenario:
    return Scenario(f"slow-{factor:g}", f"slow:host={SLOW_HOST},factor={factor:g}@step={SLOW_STEP}", factor)


SLOW_SCENARIOS = [slow_scenario(factor) for factor in FLAG_TARGET_STEPS]
SCALE_DOWN = Scenario("scale-down", f"lose:host={LOST_HOST}@step={LOSE_STEP}")
HEALTHY = Scenario("healthy", None)
