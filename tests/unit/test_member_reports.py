"""What a host's supervisor reports is a `messages` model from the start: once its supervisor stamps
the host it serves, the leader reads back exactly the report that was built."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from slicekeeper.supervisor import messages
from slicekeeper.supervisor.host.detectors import crash_message, finished_message
from slicekeeper.supervisor.workload_process import ExitStatus

WORKLOAD = SimpleNamespace(log_path=Path("/run/host-1/workload.log"))


def as_the_leader_reads_it(report: messages.MemberReport, host: int = 1) -> messages.ToLeader:
    return messages.to_leader(report.model_copy(update={"host": host}).encode())


@pytest.mark.parametrize(
    "report",
    [
        finished_message(3, {"step": 100, "fingerprint": "abc"}),
        finished_message(3, {"step": 100}),
        crash_message(ExitStatus(1), 3, WORKLOAD),  # type: ignore[arg-type]
        crash_message(ExitStatus(-9), 3, WORKLOAD),  # type: ignore[arg-type]
        crash_message(ExitStatus(0), 3, WORKLOAD),  # type: ignore[arg-type]
    ],
    ids=["finished", "finished-without-fingerprint", "exit-1", "killed", "exit-0-before-done"],
)
def test_a_workloads_exit_reaches_the_leader_as_it_was_built(report):
    read = as_the_leader_reads_it(report)
    assert read == report.model_copy(update={"host": 1})


def test_a_crash_by_a_signal_names_the_signal_and_no_exit_code():
    report = crash_message(ExitStatus(-9), 3, WORKLOAD)  # type: ignore[arg-type]
    assert (report.kind, report.signal, report.exit_code) == ("crash", "SIGKILL", None)
    assert "killed by SIGKILL" in report.detail and str(WORKLOAD.log_path) in report.detail


def test_the_host_a_report_names_is_the_one_its_supervisor_stamped():
    report = messages.Fault(generation=2, kind="hang", silent_seconds=31.5, detail="no progress")
    assert report.host == messages.UNSTAMPED
    read = as_the_leader_reads_it(report, host=5)
    assert isinstance(read, messages.Fault) and (read.host, read.silent_seconds) == (5, 31.5)


def test_a_stop_acknowledgement_carries_the_replicas_by_owner_across_the_wire():
    report = messages.Stopped(generation=4, committed=[10, 20], replicas={0: [10], 3: [10, 20]})
    read = as_the_leader_reads_it(report)
    assert isinstance(read, messages.Stopped) and read.replicas == {0: [10], 3: [10, 20]}
