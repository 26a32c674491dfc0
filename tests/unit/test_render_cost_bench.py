"""benchmarks/render_cost.py's own logic: it renders the scale benchmark's job as the operator does
(every host a pod, each adopted by the job), reports every stage, and refuses a size of nothing."""

from __future__ import annotations

import json

import pytest

from benchmarks import render_cost


def test_a_small_job_is_rendered_and_adopted_pod_by_pod_with_every_stage_reported(capsys):
    job, body = render_cost.rendered(64)
    pods = list(job.pods())
    assert len(pods) == 64 and len({pod["metadata"]["name"] for pod in pods}) == 64
    assert render_cost.main(["--hosts", "64", "--repeats", "1"]) == 0
    figures = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert figures["hosts"] == 64
    assert all(figures[stage] >= 0 for stage in ("render_us", "adopt_us", "json_us", "orjson_us"))
    assert figures["bytes_per_pod"] > 1000  # a whole pod's manifest, not an empty one
    assert body["metadata"]["uid"] == render_cost.OWNER_UID  # the owner the adopt stage names


@pytest.mark.parametrize("argument", [["--hosts", "0"], ["--repeats", "0"]])
def test_a_size_of_nothing_is_refused(argument, capsys):
    with pytest.raises(SystemExit) as stopped:
        render_cost.main(argument)
    assert stopped.value.code == 2 and "must be at least 1" in capsys.readouterr().err
