"""The simulator's control-plane costs as lines in the job's size, fitted to the benchmark's figures
(supervisor/fleet/costs.py `fit_size_curve`, benchmarks/control_plane_fit.py)."""

from __future__ import annotations

import json

import pytest
from slicekeeper.supervisor.fleet.costs import CostModel, SizeCurve, fit_size_curve, with_settings

from benchmarks import control_plane_fit
from slicekeeper.errors import UserError

MEASURED = [
    {"hosts": 1000, "restart_round_s": 0.16, "handover_rejoin_s": 0.53},
    {"hosts": 5000, "restart_round_s": 0.80, "handover_rejoin_s": 4.29},
    {"hosts": 10000, "restart_round_s": 1.88, "handover_rejoin_s": 10.28},
]
"""The documented run the defaults come from (docs/simulator.md): the restart rounds measured, the
hand-over's rejoining part as its registration time less the kill-to-election part."""


def test_points_on_a_line_give_that_line_back() -> None:
    curve = fit_size_curve([(1000, 0.7), (5000, 2.7), (10000, 5.2)])
    assert curve.base_seconds == pytest.approx(0.2) and curve.per_host_seconds == pytest.approx(0.0005)
    assert curve.at(25_000) == pytest.approx(12.7)


def test_a_line_whose_base_would_be_negative_goes_through_the_origin() -> None:
    curve = fit_size_curve([(1000, 0.16), (5000, 0.80), (10000, 1.88)])
    assert curve.base_seconds == 0.0
    assert curve.per_host_seconds == pytest.approx((1000 * 0.16 + 5000 * 0.8 + 10000 * 1.88) / 126e6)


def test_one_size_is_not_a_line() -> None:
    with pytest.raises(UserError, match=r"two sizes at least, got \[1000\]"):
        fit_size_curve([(1000, 0.2), (1000, 0.3)])


def test_each_part_of_a_line_is_set_by_its_own_name() -> None:
    model = with_settings(CostModel(), ["handover_base_seconds=0.5", "handover_per_host_seconds=0.001"])
    assert model.handover == SizeCurve(0.5, 0.001) and model.handover.at(25_000) == pytest.approx(25.5)
    assert model.restart_round == CostModel().restart_round  # the other line unchanged


def test_the_defaults_fit_the_documented_run_and_a_stale_one_is_named(tmp_path, capsys) -> None:
    run = tmp_path / "control-plane.txt"
    run.write_text("a table line\n" + "\n".join(json.dumps(line) for line in MEASURED) + "\n")
    assert control_plane_fit.misses(MEASURED, CostModel()) == []
    assert control_plane_fit.main([str(run)]) == 0
    assert "--cost handover_per_host_seconds=" in capsys.readouterr().out
    # Negative control: a hand-over priced at half the run's is named, with both figures.
    stale = with_settings(
        CostModel(), [f"handover_per_host_seconds={CostModel().handover.per_host_seconds / 2}"]
    )
    missed = control_plane_fit.misses(MEASURED, stale)
    assert len(missed) == 2 and missed[0].startswith("handover at 5,000 hosts: the default prices 2.48 s")


def test_a_file_without_the_benchmarks_lines_is_refused_by_name(tmp_path) -> None:
    run = tmp_path / "empty.txt"
    run.write_text("nothing here\n")
    with pytest.raises(SystemExit, match=r"empty\.txt: no JSON line"):
        control_plane_fit.main([str(run)])
