"""A host supervisor's account at its end (`report.json` in its machine's folder), and the accounts of
the supervisors that ran on the same machine before it.

`slicekeeper run` adds up every machine's accounts into the run's report (slicekeeper.report); a
supervisor that crashed and was started again on its machine (supervisor.host.machine_record) leaves
its account under another name, so that the time it accounted still counts.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from slicekeeper.supervisor.checkpoints.tiers import CheckpointTiers
from slicekeeper.supervisor.host.generation import Generation
from slicekeeper.supervisor.host.sdk_events import SdkEvents
from slicekeeper.supervisor.messages import Journal
from slicekeeper.supervisor.signals.hang import HangDetector

from slicekeeper.goodput import GoodputAccountant
from slicekeeper.shape import HostId

REPORT_FILE = "report.json"


def keep_predecessors_report(machine_dir: Path, restart: int) -> None:
    """The supervisor before this one (restart `restart` of the machine) ended with a report of its
    own: kept, for the run's account, before this one writes its own."""
    previous = machine_dir / REPORT_FILE
    if previous.exists():
        previous.replace(machine_dir / f"report.before-restart-{restart}.json")


def host_report(
    *,
    machine: str,
    end: str | None,
    retired: bool,
    identity: HostId,
    accountant: GoodputAccountant,
    generation: Generation,
    journal: Journal | None,
    sdk: SdkEvents,
    detector: HangDetector,
    tiers: CheckpointTiers,
    exit_code: int | None,
    now: float,
) -> dict[str, Any]:
    """The account of a supervisor that served host `identity`; `end`: "lost" (its machine gone),
    "crashed" (this process), or None."""
    return {
        **_machine_account(machine, end),
        "retired": retired,
        "host": identity.index,
        "slice": identity.slice,
        "worker": identity.worker,
        **_time_account(accountant, now),
        "restarts": generation.restarts,
        "faults": generation.faults,
        "journal_seq": journal.seq if journal else None,
        "fingerprint": sdk.fingerprint,
        "last_checkpoint_step": sdk.last_checkpoint,
        "typical_step_seconds": detector.typical_step_seconds,
        "exit_code": exit_code,
        "persistent_reads": _persistent_reads(tiers),
    }


def spare_report(
    *,
    machine: str,
    end: str | None,
    accountant: GoodputAccountant,
    tiers: CheckpointTiers,
    exit_code: int | None,
    now: float,
) -> dict[str, Any]:
    """The account of a spare that was never assigned a host: its time, no host's (the run's report
    adds up hosts only, slicekeeper.report)."""
    return {
        **_machine_account(machine, end),
        "retired": False,
        "host": None,
        "slice": None,
        "worker": None,
        **_time_account(accountant, now),
        "restarts": {},
        "faults": {},
        "journal_seq": None,
        "fingerprint": None,
        "last_checkpoint_step": None,
        "typical_step_seconds": None,
        "exit_code": exit_code,
        "persistent_reads": _persistent_reads(tiers),
    }


def _machine_account(machine: str, end: str | None) -> dict[str, Any]:
    return {"machine": machine, "lost": end == "lost", "crashed": end == "crashed"}


def _time_account(accountant: GoodputAccountant, now: float) -> dict[str, Any]:
    seconds = accountant.seconds(now)
    return {
        "wall_seconds": now - accountant.start,
        "seconds": {c.value: v for c, v in seconds.items()},
        "high_water": accountant.high_water,
        "productive_step_seconds": accountant.productive_step_seconds,
    }


def _persistent_reads(tiers: CheckpointTiers) -> dict[str, Any] | None:
    return asdict(tiers.persistent.reads) if tiers.persistent else None


def write_host_report(machine_dir: Path, report: dict[str, Any]) -> None:
    (machine_dir / REPORT_FILE).write_text(json.dumps(report, indent=1))
