"""One vocabulary of fault kinds (slicekeeper.policy.events.FaultKind): the wire, the job's memory,
the policy's events and what each chaos fault is expected to be detected as."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from slicekeeper.supervisor import messages

from slicekeeper.chaos import ChaosKind
from slicekeeper.policy import EventKind
from slicekeeper.policy.events import FaultKind


def test_every_policy_event_kind_is_a_fault_kind_and_decided_as_itself():
    for kind in EventKind:
        assert FaultKind(kind.value).event_kind is kind


def test_a_checkpoint_fault_is_decided_as_checkpoint_invalid_and_a_scale_down_as_no_event():
    assert FaultKind.NONFINITE_LOSS.event_kind is EventKind.CHECKPOINT_INVALID
    assert FaultKind.RESTORE_FAILED.event_kind is EventKind.CHECKPOINT_INVALID
    assert FaultKind.SCALE_DOWN.event_kind is None


@pytest.mark.parametrize(
    ("chaos", "detected_as"),
    [
        (ChaosKind.KILL, FaultKind.CRASH),
        (ChaosKind.HANG, FaultKind.HANG),
        (ChaosKind.LOSE, FaultKind.HOST_LOST),
        (ChaosKind.CRASH_SUPERVISOR, FaultKind.CRASH),
        (ChaosKind.SLOW, FaultKind.STRAGGLER),
        (ChaosKind.CORRUPT, None),
        (ChaosKind.SPARE, None),
    ],
)
def test_each_chaos_fault_names_the_fault_kind_it_is_detected_as(chaos, detected_as):
    assert chaos.detected_as is detected_as
    assert (detected_as is not None) == (chaos.disruptive or chaos is ChaosKind.SLOW)


def test_the_wire_carries_the_fault_kind_as_an_enum_and_refuses_an_unknown_one():
    line = messages.Fault(host=1, generation=0, kind=FaultKind.CRASH).encode()
    assert b'"kind":"crash"' in line
    report = messages.to_leader(line)
    assert isinstance(report, messages.Fault) and report.kind is FaultKind.CRASH
    with pytest.raises(ValidationError):
        messages.Fault(host=1, generation=0, kind="explosion")  # type: ignore[arg-type]
