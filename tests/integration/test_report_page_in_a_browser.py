"""The page `slicekeeper run` writes next to its report, opened in headless Chromium after a real run
with a fault: it loads without a console error or a request for anything but itself, it shows
something (its screenshot is not one colour, its bands are in their colours), and its timeline marks
the fault, its detection and the return to training.

One short run of the SDK example loop job with a workload killed serves every test of the module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slicekeeper.report_timeline import CATEGORY_COLOURS
from tests.support.browser import colours, has_colour, visit
from tests.support.cli_runs import run_job
from tests.support.secrets import leaked_fragments


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, str]:
    """The run (report, page, stdout): 40 steps, host 1's workload killed at step 12."""
    where = tmp_path_factory.mktemp("page")
    result, report = run_job(where, "--chaos", "kill:host=1@step=12")
    assert result.returncode == 0, result.stderr
    assert report is not None
    page = where / "report.html"
    return report, page, result.stdout


def test_the_run_writes_its_page_next_to_its_report_and_says_where(killed_run):
    report, page, stdout = killed_run
    assert f"  page: {page}" in stdout.splitlines()
    assert page.is_file()
    # one fault, detected once, training again once: what the markers below count on
    [fault] = report["faults"]
    assert fault["detected_at"] is not None and fault["resumed_at"] is not None
    assert len(report["detections"]) == 1


def test_the_page_holds_no_fragment_of_the_jobs_private_key(killed_run):
    report, page, _ = killed_run
    credentials = Path(report["run_dir"]) / "credentials"
    assert leaked_fragments(credentials, {"page": page.read_text()}) == []


def test_the_page_loads_with_no_console_error_and_asks_for_nothing_but_itself(killed_run, tmp_path):
    _, page, _ = killed_run
    with visit(page) as seen:
        assert seen.page.title().startswith("tiny-lm: succeeded")
    assert seen.console_errors == []
    assert seen.aborted == []
    assert set(seen.requests) <= {seen.url}


def test_the_page_is_not_blank_and_shows_its_bands_in_their_colours(killed_run, tmp_path):
    _, page, _ = killed_run
    with visit(page) as seen:
        whole = seen.page.screenshot(full_page=True, path=tmp_path / "page.png")
        timeline = seen.page.locator("#timeline").screenshot()
        box = seen.page.locator("#timeline").bounding_box()
    counts = colours(whole)
    assert len(counts) > 10, f"a blank page: {sorted(counts.items(), key=lambda kv: -kv[1])[:3]}"
    assert max(counts.values()) < 0.95 * sum(counts.values())
    assert box is not None and box["width"] > 800 and box["height"] > 200
    in_timeline = colours(timeline)
    for category in ("productive", "infrastructure_recovery"):
        assert has_colour(in_timeline, CATEGORY_COLOURS[category]), category


def test_the_timeline_marks_the_fault_its_detection_and_the_return_to_training(killed_run):
    report, page, _ = killed_run
    with visit(page) as seen:
        svg = seen.page.locator("svg#timeline")
        markers = {
            kind: svg.locator(f".marker.marker-{kind}").count() for kind in ("fault", "detection", "recovery")
        }
        total = svg.locator(".marker").count()
        label = svg.locator(".marker-fault text").text_content()
        lines = svg.locator("polyline.host-steps").count()
        recovery_bands = svg.locator(
            'rect.band[data-host="1"][data-category="infrastructure_recovery"]'
        ).count()
        decisions = seen.page.locator("#decisions tr").count()
        hosts = seen.page.locator("#hosts tr").count()
    assert markers == {"fault": 1, "detection": 1, "recovery": 1} and total == 3
    assert label == "kill host 1"
    assert lines == 4 and recovery_bands >= 1
    assert decisions == 1 + len(report["decisions"]) and report["decisions"]
    assert hosts == 1 + 4
