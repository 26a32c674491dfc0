"""Each fault's recovery split into its parts, host by host (slicekeeper/recovery_breakdown.py), from
event logs written here with known times: every part measures the span it names, a host that never
got back to a new step has no total, and the hosts that compiled programs again are named."""

from __future__ import annotations

from typing import Any

import pytest

from slicekeeper.recovery_breakdown import (
    PARTS,
    breakdown_line,
    compiled_by_host,
    fault_breakdown,
)

STARTED = 1000.0
"""The run's start (Unix seconds); a fault's times are relative to it, the records' absolute."""


def workload(t: float, type_: str, generation: int = 1, **fields: Any) -> dict[str, Any]:
    return {"source": "workload", "generation": generation, "type": type_, "t": STARTED + t, **fields}


def before_the_fault(high_water: int) -> list[dict[str, Any]]:
    """Generation 0 trained up to `high_water` (its last step ended at t = 9.9)."""
    return [
        workload(9.8, "step_begin", 0, step=high_water),
        workload(9.9, "step_end", 0, step=high_water, loss=1.0),
    ]


def restarted_host(*, compiled: list[str], productive: bool = True) -> list[dict[str, Any]]:
    """A host that restarts from step 15 after training to step 20 (restarted at t = 10.2)."""
    records = [
        *before_the_fault(20),
        {"source": "leader", "type": "start", "generation": 1, "restore_step": 15, "t": STARTED + 10.2},
        workload(10.3, "hello", pid=7),
        workload(10.3, "phase", phase="tpu_initialization"),
        workload(10.5, "phase", phase="idle"),
        workload(10.5, "phase", phase="training_prep"),
        workload(10.6, "phase", phase="idle"),
        workload(10.6, "phase", phase="checkpoint_restore"),
        workload(10.65, "phase", phase="idle"),
        workload(10.65, "phase", phase="program_startup"),
        workload(
            10.7, "programs", loaded=[n for n in ("gather", "apply") if n not in compiled], compiled=compiled
        ),
        workload(10.95, "phase", phase="idle"),
        workload(11.0, "step_begin", step=16),
        workload(11.3, "step_end", step=16, loss=1.0),
    ]
    if productive:
        records += [workload(11.3 + (s - 16) * 0.16, "step_end", step=s, loss=1.0) for s in range(17, 22)]
    return records


FAULT = {"kind": "kill", "host": 1, "step": 21, "fired_at": 10.0, "detected_at": 10.05}


def test_each_part_is_the_span_it_names_and_they_add_up_to_the_whole():
    breakdown = fault_breakdown(FAULT, {0: restarted_host(compiled=[])}, STARTED)
    [host] = breakdown["hosts"]
    expected = {
        "detect": 0.05,
        "stop": 0.15,  # detected -> the leader's start reached this host
        "launch": 0.1,  # that start -> the workload's hello
        "distributed_init": 0.2,
        "prep": 0.1,
        "restore": 0.05,
        "programs": 0.3,
        "first_step": 0.3,
        "steps_again": 0.8,  # the end of step 16 -> the end of step 21, past the high-water mark 20
        "total": 2.1,  # the fault -> that step's end
    }
    for part, seconds in expected.items():
        assert host[part] == pytest.approx(seconds, abs=1e-6), part
    assert host["other"] == pytest.approx(0.05, abs=1e-6)  # the gap before the first step's begin
    assert sum(host[p] for p in PARTS) == pytest.approx(host["total"], abs=1e-6)
    assert host["generation"] == 1 and host["loaded"] == ["gather", "apply"] and host["compiled"] == []


def test_the_slowest_host_of_each_part_is_named_and_a_host_never_productive_has_no_total():
    slow_programs = [
        {**r, "t": r["t"] + 0.5}
        if r.get("type") in ("step_begin", "step_end") and r.get("generation") == 1
        else r
        for r in restarted_host(compiled=[])
    ]
    # Host 2's idle after program_startup comes 0.5 s later as well: move it with the steps.
    slow_programs = [
        {**r, "t": r["t"] + 0.5} if r.get("phase") == "idle" and r["t"] == STARTED + 10.95 else r
        for r in slow_programs
    ]
    breakdown = fault_breakdown(
        FAULT,
        {0: restarted_host(compiled=[]), 2: slow_programs, 3: restarted_host(compiled=[], productive=False)},
        STARTED,
    )
    assert breakdown["slowest"]["programs"] == {"seconds": pytest.approx(0.8), "host": 2}
    never = next(h for h in breakdown["hosts"] if h["host"] == 3)
    assert "total" not in never and "steps_again" not in never and never["first_step"] == pytest.approx(0.3)
    assert breakdown["slowest"]["total"]["host"] == 2


def test_a_host_without_a_generation_after_the_detection_is_left_out_and_no_detection_no_breakdown():
    assert fault_breakdown(FAULT, {0: before_the_fault(20)}, STARTED) == {"hosts": [], "slowest": {}}
    assert fault_breakdown({**FAULT, "detected_at": None}, {0: restarted_host(compiled=[])}, STARTED) is None


def test_the_hosts_that_compiled_again_are_named_in_the_line_and_none_otherwise():
    quiet = fault_breakdown(FAULT, {0: restarted_host(compiled=[]), 1: restarted_host(compiled=[])}, STARTED)
    assert compiled_by_host(quiet) == {}
    assert "compiled again" not in (breakdown_line(quiet) or "")
    assert (breakdown_line(quiet) or "").startswith("detect 0.05 | stop 0.15 | launch 0.10")
    noisy = fault_breakdown(
        FAULT, {0: restarted_host(compiled=[]), 1: restarted_host(compiled=["apply"])}, STARTED
    )
    assert compiled_by_host(noisy) == {1: ["apply"]}
    assert (breakdown_line(noisy) or "").endswith("; compiled again: host 1 (apply)")
