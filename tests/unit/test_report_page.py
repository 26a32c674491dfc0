"""The run's page (slicekeeper.report_page) from a made-up run: its timeline's markers, step lines and
badput bands, its tables, what it reads of the run directory, its escaping, and that it stands alone.

The made-up run: two hosts; host 1's machine is killed at 3.5 s (a `kill` fault, detected at 4.0 s as a
crash, training again at 7.5 s) and spare-0 takes host 1 over; a `hang` of host 0 fires at 8.0 s and
is never detected; the leader detects a non-finite loss at 9.0 s that no fault caused.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pytest
from slicekeeper.supervisor.local.local_runtime import write_page_beside

from slicekeeper import report_page
from slicekeeper.report_page import page_path, render_page, write_page
from slicekeeper.report_timeline import PLOT_WIDTH, read_timelines
from tests.support.html_page import parse_page, shows_as_text

STARTED = 1_700_000_000.0
HOSTILE = "<script>alert(1)</script>"


def interval(category: str, start: float, end: float) -> dict[str, Any]:
    return {
        "t": STARTED + end,
        "source": "goodput",
        "type": "interval",
        "category": category,
        "start": STARTED + start,
        "end": STARTED + end,
    }


def step_end(step: int, at: float) -> dict[str, Any]:
    return {"t": STARTED + at, "source": "workload", "type": "step_end", "step": step, "generation": 0}


def write_log(run_dir: Path, machine: str, records: list[dict[str, Any]], tail: str = "") -> None:
    (run_dir / machine).mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(record) for record in records]
    (run_dir / machine / "events.jsonl").write_text("\n".join(lines) + "\n" + tail)


def made_up_run(run_dir: Path, **report_changes: Any) -> dict[str, Any]:
    """The module docstring's run: its machines' event logs in `run_dir`, and its report."""
    write_log(
        run_dir,
        "host-0",
        [
            interval("program_startup", 0.0, 1.0),
            *(step_end(step, 1.0 + 0.5 * step) for step in range(1, 6)),
            interval("productive", 1.0, 3.5),
            interval("infrastructure_recovery", 3.5, 6.5),
            interval("program_startup", 6.5, 7.0),
            step_end(4, 7.5),
            step_end(5, 8.0),
            interval("wasted_progress", 7.0, 8.0),
            *(step_end(step, 8.0 + 0.5 * (step - 5)) for step in range(6, 10)),
            interval("productive", 8.0, 10.0),
        ],
        tail='{"t": 17000',  # a torn last line: its writer was killed mid-line
    )
    write_log(
        run_dir,
        "host-1",
        [
            interval("program_startup", 0.0, 1.0),
            *(step_end(step, 1.0 + 0.5 * step) for step in range(1, 6)),
            interval("productive", 1.0, 3.5),
            interval("infrastructure_recovery", 3.5, 4.0),
        ],
    )
    write_log(
        run_dir,
        "spare-0",
        [
            interval("checkpoint_save", 0.0, 4.0),  # a spare's own time, before it served host 1
            step_end(99, 2.0),
            {"t": STARTED + 4.0, "source": "leader", "type": "assign", "host": 1, "machine": "spare-0"},
            interval("infrastructure_recovery", 4.0, 6.5),
            interval("program_startup", 6.5, 7.0),
            step_end(4, 7.5),
            step_end(5, 8.0),
            interval("wasted_progress", 7.0, 8.0),
            *(step_end(step, 8.0 + 0.5 * (step - 5)) for step in range(6, 10)),
            interval("productive", 8.0, 10.0),
        ],
    )
    host_badput = {
        "infrastructure_recovery": 3.0,
        "program_startup": 1.5,
        "wasted_progress": 1.0,
        "other": 0.0,
    }
    report: dict[str, Any] = {
        "job": "tiny-lm",
        "state": "succeeded",
        "failure_reason": None,
        "steps_completed": 9,
        "goodput": 0.45,
        "badput_seconds": host_badput,
        "restarts": {"crash": 1},
        "faults": [
            {
                "kind": "kill",
                "host": 1,
                "step": 6,
                "fired_at": 3.5,
                "detected_as": "crash",
                "detected_at": 4.0,
                "resumed_at": 7.5,
                "productive_at": 8.5,
                "detection_seconds": 0.5,
                "recovery_seconds": 3.5,
                "detail": "",
            },
            {
                "kind": "hang",
                "host": 0,
                "step": 9,
                "fired_at": 8.0,
                "detected_as": None,
                "detected_at": None,
                "resumed_at": None,
                "productive_at": None,
                "detection_seconds": None,
                "recovery_seconds": None,
                "detail": "the run ended first",
            },
        ],
        "detections": [
            {"kind": "crash", "host": 1, "generation": 0, "detected_at": 4.0, "detail": "workload killed"},
            {"kind": "nonfinite_loss", "host": 0, "generation": 1, "detected_at": 9.0, "detail": "loss nan"},
        ],
        "decisions": [
            {
                "t": 4.0,
                "step": 5,
                "generation": 0,
                "event": {"kind": "crash", "host": 1, "exit_code": -9},
                "action": {"name": "replace_host", "host": 1},
                "source": "user",
                "reason": "spares are cheap",
            },
        ],
        "wall_seconds": 10.0,
        "started_at": STARTED,
        "generations": 2,
        "ideal_step_seconds": 0.5,
        "params_fingerprint": "ab" * 32,
        "run_dir": str(run_dir),
        "hosts": [
            {
                "host": host,
                "slice": 0,
                "worker": host,
                "exit_code": 0,
                "goodput": 0.45,
                "productive_seconds": 4.5,
                "badput_seconds": host_badput,
                "restarts": {"crash": 1},
                "faults": {"crash": host},
                "last_checkpoint_step": 5,
                "typical_step_seconds": 0.5,
                "machines": machines,
            }
            for host, machines in ((0, ["host-0"]), (1, ["host-1", "spare-0"]))
        ],
    }
    report.update(report_changes)
    return report


def rendered(tmp_path: Path, **report_changes: Any) -> str:
    report = made_up_run(tmp_path / "run", **report_changes)
    return render_page(report, read_timelines(report))


def markers(page: str) -> dict[str, list[dict[str, str]]]:
    """The timeline's markers by kind: the attributes of each marker's line, in time order."""
    parsed = parse_page(page)
    found: dict[str, list[dict[str, str]]] = {}
    elements = parsed.elements
    for n, element in enumerate(elements):
        if "marker" in element.classes:
            kind = next(c for c in element.classes if c.startswith("marker-")).removeprefix("marker-")
            line = next(e for e in elements[n:] if e.tag == "line")
            found.setdefault(kind, []).append(line.attrs)
    return found


# --- the timeline ---------------------------------------------------------------------------------


def test_each_fault_its_detection_and_the_return_to_training_have_a_marker(tmp_path):
    found = markers(rendered(tmp_path))
    # kill and hang fired; the crash detected once (the leader lists it too), the non-finite loss
    # no fault caused; training went on once (the hang was never detected)
    assert {kind: len(lines) for kind, lines in found.items()} == {"fault": 2, "detection": 2, "recovery": 1}
    fired, detected, back = (float(found[kind][0]["x1"]) for kind in ("fault", "detection", "recovery"))
    assert fired < detected < back
    assert float(found["fault"][1]["x1"]) == pytest.approx(80 + PLOT_WIDTH * 0.8)  # the hang, at 8 of 10 s


def test_markers_are_labelled_with_the_fault_kind_and_what_was_detected(tmp_path):
    text = parse_page(rendered(tmp_path)).text
    for label in (
        "kill host 1",
        "hang host 0",
        "crash detected",
        "nonfinite_loss detected",
        "training again",
    ):
        assert label in text


def test_each_host_has_a_band_of_every_category_its_accountant_booked(tmp_path):
    page = parse_page(rendered(tmp_path))
    bands = page.having_class("band")
    by_host: dict[str, set[str]] = {}
    for band in bands:
        by_host.setdefault(band.attrs["data-host"], set()).add(band.attrs["data-category"])
    assert set(by_host) == {"0", "1"}
    expected = {"program_startup", "productive", "infrastructure_recovery", "wasted_progress"}
    assert by_host["0"] == expected
    # host 1's band ends with spare-0's time from its assignment on, not the spare's own time before
    assert by_host["1"] == expected
    colours = {element.attrs["data-category"]: element.attrs["fill"] for element in bands}
    assert colours["infrastructure_recovery"] == report_page.CATEGORY_COLOURS["infrastructure_recovery"]
    legend = {element.attrs.get("data-category") for element in page.having_class("legend-category")}
    assert legend == expected


def test_time_no_supervisor_accounted_for_is_other_as_in_the_report(tmp_path):
    page = parse_page(rendered(tmp_path, wall_seconds=12.5))  # the supervisors' accounts end at 10 s
    for host in ("0", "1"):
        [last] = [band for band in page.having_class("band") if band.attrs["data-host"] == host][-1:]
        assert last.attrs["data-category"] == "other"
        assert float(last.attrs["x"]) == pytest.approx(80 + PLOT_WIDTH * 10 / 12.5, abs=1)
        assert float(last.attrs["width"]) == pytest.approx(PLOT_WIDTH * 2.5 / 12.5, abs=1)


def test_a_host_served_by_two_machines_has_the_steps_of_both_and_a_spare_none_of_its_own(tmp_path):
    report = made_up_run(tmp_path / "run")
    timelines = read_timelines(report)
    assert [step for _, step in timelines[0].steps] == [
        1,
        2,
        3,
        4,
        5,
        4,
        5,
        6,
        7,
        8,
        9,
    ]  # back after the restore
    assert [step for _, step in timelines[1].steps] == [1, 2, 3, 4, 5, 4, 5, 6, 7, 8, 9]
    assert timelines[1].steps[0] == (pytest.approx(1.5), 1)  # seconds since the run started
    assert "checkpoint_save" not in {category for _, _, category in timelines[1].intervals}
    lines = parse_page(render_page(report, timelines)).having_class("host-steps")
    assert [line.attrs["data-host"] for line in lines] == ["0", "1"]


def test_a_long_run_draws_at_most_a_few_points_and_bands_per_pixel(tmp_path):
    run_dir = tmp_path / "run"
    report = made_up_run(run_dir, steps_completed=100_000, wall_seconds=5_000.0)
    records = []
    for step in range(1, 100_001):
        records += [interval("other", step * 0.05 - 0.05, step * 0.05 - 0.049)]
        records += [interval("productive", step * 0.05 - 0.049, step * 0.05), step_end(step, step * 0.05)]
    write_log(run_dir, "host-0", records)
    page = parse_page(render_page(report, read_timelines(report)))
    [line] = [e for e in page.having_class("host-steps") if e.attrs["data-host"] == "0"]
    assert len(line.attrs["points"].split()) <= 2 * (PLOT_WIDTH + 1)
    assert len([e for e in page.having_class("band") if e.attrs["data-host"] == "0"]) <= PLOT_WIDTH
    assert {e.attrs["data-category"] for e in page.having_class("band") if e.attrs["data-host"] == "0"} == {
        "productive"
    }  # the 1 ms between steps is too thin to show


# --- the tables ---------------------------------------------------------------------------------


def test_the_host_table_shows_each_host_with_its_badput_restarts_and_machines(tmp_path):
    page = rendered(tmp_path)
    hosts_table = page.split('<table id="hosts">')[1].split("</table>")[0]
    header = parse_page(hosts_table.split("</tr>")[0])
    for column in ("goodput", "restarts", "machines"):
        assert column in header.text
    categories = [e.attrs["data-category"] for e in header.elements if "data-category" in e.attrs]
    assert categories == ["program_startup", "wasted_progress", "infrastructure_recovery"]  # goodput's order
    # no host lost a twentieth of a second to `other`; headings may break after an underscore
    assert "infrastructure_ recovery (s)" in header.text and "other" not in header.text
    rows = [parse_page(row).text for row in hosts_table.split("</tr>")[1:-1]]
    assert len(rows) == 2
    assert "host-1, spare-0" in rows[1] and "crash 1" in rows[1] and "3.0" in rows[1]


def test_the_decisions_and_the_faults_are_listed(tmp_path):
    text = parse_page(rendered(tmp_path)).text
    assert "replace_host" in text and "spares are cheap" in text and "exit_code=-9" in text
    assert "the run ended first" in text


def test_each_recovery_is_shown_part_by_part_per_host_with_the_slowest_marked_and_what_was_compiled(tmp_path):
    report = made_up_run(tmp_path / "run")
    hosts = [
        {
            "host": 0,
            "generation": 1,
            "detect": 0.5,
            "stop": 0.2,
            "programs": 0.3,
            "total": 4.0,
            "compiled": [],
        },
        {
            "host": 1,
            "generation": 1,
            "detect": 0.5,
            "stop": 0.1,
            "programs": 2.5,
            "total": 4.5,
            "compiled": ["apply"],
        },
    ]
    slowest = {"detect": {"seconds": 0.5, "host": 1}, "stop": {"seconds": 0.2, "host": 0}}
    slowest |= {"programs": {"seconds": 2.5, "host": 1}, "total": {"seconds": 4.5, "host": 1}}
    report["faults"][0]["breakdown"] = {"hosts": hosts, "slowest": slowest}
    page = render_page(report, read_timelines(report))
    [table] = page.split('<table class="recovery">')[1:]  # the hang was never detected: no breakdown
    assert "kill on host 1 at step 6" in page
    rows = table.split("</table>")[0].split("</tr>")
    assert parse_page(rows[0]).text.split() == ["host", "detect", "stop", "programs", "total", "compiled"]
    assert "<strong>0.20</strong>" in rows[1] and "<strong>2.50</strong>" in rows[2]
    assert "none" in parse_page(rows[1]).text and "apply" in parse_page(rows[2]).text
    assert "<strong>4.50</strong>" not in rows[2]  # the whole is not a part


# --- what it reads, what it shows, where it goes -------------------------------------------------


def test_the_credentials_folder_is_never_read_even_when_the_report_names_it(tmp_path):
    run_dir = tmp_path / "run"
    report = made_up_run(run_dir)
    report["hosts"][0]["machines"] += ["credentials", "../run/credentials", "host-0/../credentials"]
    write_log(
        run_dir,
        "credentials",
        [{"t": STARTED, "source": "leader", "type": "assign", "host": 0}, step_end(77, 1)],
    )
    assert 77 not in {step for _, step in read_timelines(report)[0].steps}


def test_text_from_the_job_and_its_policy_shows_as_text_never_as_markup(tmp_path):
    report = made_up_run(tmp_path / "run", job=HOSTILE, failure_reason=HOSTILE)
    report["decisions"][0]["reason"] = HOSTILE
    report["faults"][1]["detail"] = HOSTILE
    page = render_page(report, read_timelines(report))
    assert shows_as_text(page, HOSTILE)
    assert page.count(html.escape(HOSTILE)) >= 4  # the title, the heading, the reason, the detail
    # negative control: the same page with the text left raw would run a script, and the check says so
    assert not shows_as_text(page.replace(html.escape(HOSTILE), HOSTILE), HOSTILE)


def test_the_page_stands_alone_and_may_load_nothing(tmp_path):
    page = rendered(tmp_path)
    parsed = parse_page(page)
    assert parsed.tags().isdisjoint({"script", "link", "img", "iframe", "object", "embed", "base"})
    assert not [element for element in parsed.elements if {"src", "href"} & element.attrs.keys()]
    [policy] = [e for e in parsed.elements if e.attrs.get("http-equiv") == "Content-Security-Policy"]
    assert policy.attrs["content"].startswith("default-src 'none';")


def test_a_report_without_event_logs_still_has_its_page(tmp_path):
    report = made_up_run(tmp_path / "run")
    del report["run_dir"]
    page = render_page(report, read_timelines(report))
    assert "No step of any host was found" in parse_page(page).text
    assert len(markers(page)["fault"]) == 2


@pytest.mark.parametrize(
    ("report", "page"),
    [
        ("report.json", "report.html"),
        ("demo-report.json", "demo-report.html"),
        ("report", "report.html"),
        ("report.html", "report.html.html"),
    ],
)
def test_the_page_goes_next_to_the_report_with_html_for_its_suffix(tmp_path, report, page):
    assert page_path(tmp_path / report) == tmp_path / page


def test_the_run_says_where_its_page_is_and_a_page_that_fails_is_only_said(tmp_path):
    report = made_up_run(tmp_path / "run")
    said: list[str] = []
    write_page_beside(report, tmp_path / "report.json", said.append)
    assert said == [f"  page: {tmp_path / 'report.html'}"]
    assert "tiny-lm" in (tmp_path / "report.html").read_text()
    (tmp_path / "other.html").mkdir()  # in the way: the page cannot be written
    said.clear()
    write_page_beside(report, tmp_path / "other.json", said.append)
    assert said == [
        f"  page: not written (IsADirectoryError: [Errno 21] Is a directory: '{tmp_path / 'other.html'}')"
    ]
    with pytest.raises(IsADirectoryError):
        write_page(report, tmp_path / "other.json")
