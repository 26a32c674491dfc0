"""The order the suite's files are handed to pytest-xdist's workers: the longest first.

`make test` runs each file on one worker (`--dist loadfile`) and hands a worker its next file when it
is almost done with the last. pytest-xdist's own order (most tests first) started the longest file,
the operator's training runs (8 minutes of test time on a loaded machine), in the middle of the run,
and the run ended with it alone on one worker. Handed out longest first (with
`--no-loadscope-reorder`), the long files overlap from the start and the many short unit files fill
the end. The figures are each file's test seconds with three workers (a fresh clone of 2c26ee4,
`pytest -n 3 --dist loadfile --junitxml`); a stale figure costs time, never a result. A file not
listed keeps its place after these.
"""

from __future__ import annotations

import pytest

LONGEST_FILES = {
    "tests/operator/test_operator_training.py": 480,
    "tests/chaos/test_jax_recovery.py": 379,
    "tests/chaos/test_torch_recovery.py": 319,
    "tests/integration/test_torch_sdk_loop.py": 190,
    "tests/integration/test_checkpoint_formats.py": 188,
    "tests/chaos/test_jax_leader_handover.py": 166,
    "tests/integration/test_leader_handover.py": 135,
    "tests/operator/test_operator_kill_points.py": 106,
    "tests/integration/test_partitions.py": 105,
    "tests/integration/test_policies_end_to_end.py": 103,
    "tests/unit/test_reference_elastic.py": 86,
    "tests/operator/test_operator_replicas.py": 85,
    "tests/operator/test_operator_resume.py": 83,
    "tests/integration/test_local_runtime.py": 75,
    "tests/integration/test_checkpoint_tiers.py": 69,
    "tests/integration/test_hang_culprit.py": 61,
    "tests/integration/test_cli_runs_end_with_their_test.py": 61,
    "tests/operator/test_pod_waits_for_its_leader.py": 53,
    "tests/integration/test_simulator_replay.py": 52,
    "tests/operator/test_operator_under_api_trouble.py": 45,
    "tests/chaos/test_jax_policies.py": 44,
    "tests/integration/test_monitoring_of_a_run.py": 41,
    "tests/integration/test_announced_losses_in_a_run.py": 39,
    "tests/integration/test_metrics_of_a_running_job.py": 38,
}
"""Test seconds of the longest files (the 24 over 35 s)."""


def longest_first(items: list[pytest.Item]) -> None:
    """Reorder `items` in place: the listed files by their time, longest first, then every other
    file in its collected order (each file's tests stay together and in their order)."""
    items.sort(key=lambda item: -LONGEST_FILES.get(item.nodeid.split("::", 1)[0], 0))
