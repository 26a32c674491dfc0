"""The suite's timeline (tests/support/timeline.py) counts the CPU of the processes a test started, and
says nothing unless asked."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import timeline

BURN = "import time\nwhile time.process_time() < 0.3: pass\nprint(time.process_time())"
"""A child that spends 0.3 s of CPU (its own clock: no wall time is compared) and says how much."""


def test_a_tests_line_holds_the_cpu_of_the_processes_it_ran(tmp_path):
    out = tmp_path / "timeline.jsonl"
    with timeline.record("tests/unit/example.py::test_burns", str(out)):
        child = subprocess.run([sys.executable, "-c", BURN], capture_output=True, text=True, check=True)
    [line] = [json.loads(text) for text in out.read_text().splitlines()]
    assert line["test"] == "tests/unit/example.py::test_burns" and line["stop"] >= line["start"]
    # The child's own count is a lower bound of what its parent's rusage of children holds once reaped;
    # measuring this process alone (without RUSAGE_CHILDREN) would miss it.
    assert line["cpu"] >= float(child.stdout) >= 0.3


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(timeline.VARIABLE, raising=False)
    monkeypatch.chdir(tmp_path)
    with timeline.record("tests/unit/example.py::test_quiet"):
        pass
    assert list(tmp_path.iterdir()) == []


def test_the_summary_totals_files_by_cpu_and_says_when_each_worker_ended(tmp_path):
    lines = [
        {"worker": "gw0", "test": "tests/a.py::one", "start": 100.0, "stop": 110.0, "cpu": 4.0},
        {"worker": "gw0", "test": "tests/a.py::two", "start": 110.0, "stop": 130.0, "cpu": 6.0},
        {"worker": "gw1", "test": "tests/b.py::one", "start": 100.0, "stop": 105.0, "cpu": 12.0},
    ]
    path = tmp_path / "timeline.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    text = timeline.summary(path).splitlines()
    assert text[0] == "3 tests: 22 s of CPU, 35 s of the workers' time"
    assert text[1] == "workers ended at gw0 30 s, gw1 5 s"
    assert [row.split()[-1] for row in text[3:]] == ["tests/b.py", "tests/a.py"]  # by CPU, most first
    assert text[4].split()[:3] == ["10.0", "30.0", "2"]
