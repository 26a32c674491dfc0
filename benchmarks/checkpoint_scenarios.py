"""The checkpoint benchmark's scenarios (benchmarks/checkpoint.py): the tiers each one configures, its
fault and the tier the faulted host must restore from, the targets; and the job file of a scenario.

The runner, the figures of a run and the table all name the same scenarios; they are defined here once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHECKPOINT_INTERVAL = 10
STALL_TARGET_PERCENT = 2.0
HOT_SWAP_TARGET_SECONDS = 15.0
PERSISTENT_READS_TARGET = 0
MB = 1e6
AFTER_SAVE_STEPS = 3
"""Steps after a save that carry its background work: the local write, the peer push, the upload."""


# --- scenarios --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    replicas: int
    persistent_interval: int | None
    fault: str | None = None
    """`kill` or `lose` (of FAULT_HOSTS[fault] at the fault step), or None."""
    spares: int = 0
    restore_tier: str | None = None
    """The tier the faulted host's shard must be staged from."""

    def chaos(self, fault_step: int) -> str | None:
        if self.fault is None:
            return None
        return f"{self.fault}:host={FAULT_HOSTS[self.fault]}@step={fault_step}"


FAULT_HOSTS = {"kill": 2, "lose": 1}

LOCAL, PEER, PERSISTENT = "local", "local+peer", "local+peer+persistent"
KILL, LOSE_PEER, LOSE_PERSISTENT = "kill-local", "lose-peer", "lose-persistent"
SCENARIOS = [
    Scenario(LOCAL, "local only", replicas=0, persistent_interval=None),
    Scenario(PEER, "local+peer", replicas=1, persistent_interval=None),
    Scenario(PERSISTENT, "local+peer+persistent", replicas=1, persistent_interval=20),
    Scenario(KILL, "kill (local restore)", 1, None, fault="kill", restore_tier="local"),
    Scenario(LOSE_PEER, "lose (peer restore)", 1, None, fault="lose", spares=1, restore_tier="peer"),
    Scenario(
        LOSE_PERSISTENT,
        "lose (persistent restore)",
        0,
        10,
        fault="lose",
        spares=1,
        restore_tier="persistent",
    ),
]


def write_job(base: dict[str, Any], scenario: Scenario, persistent_dir: Path, path: Path) -> None:
    """The base TrainingJob with spec.checkpoint overridden for the scenario, as YAML at `path`."""
    document = json.loads(json.dumps(base))  # a deep copy
    checkpoint = dict(document["spec"].get("checkpoint") or {})
    checkpoint["interval"] = CHECKPOINT_INTERVAL
    checkpoint["peer"] = {**checkpoint.get("peer", {}), "replicas": scenario.replicas}
    checkpoint.pop("persistent", None)
    if scenario.persistent_interval is not None:
        checkpoint["persistent"] = {"uri": str(persistent_dir), "interval": scenario.persistent_interval}
    document["spec"]["checkpoint"] = checkpoint
    path.write_text(yaml.safe_dump(document, sort_keys=False))
