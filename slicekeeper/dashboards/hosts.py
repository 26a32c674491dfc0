"""*Hosts*: the hosts of one TrainingJob side by side: which one is slow (straggler scores), what
each one's steps take, and where the hangs and crashes were."""

from __future__ import annotations

from grafana_foundation_sdk.builders import heatmap
from grafana_foundation_sdk.builders.dashboard import Dashboard

from slicekeeper.dashboards.panels import (
    DATASOURCE,
    HOST_ROLE,
    JOB,
    job_board,
    query,
    series,
)


def dashboard() -> Dashboard:
    return (
        job_board(
            "Hosts", "hosts", "One TrainingJob's hosts: straggler scores, step times, hangs and crashes."
        )
        .with_panel(
            heatmap.Panel()
            .title("Straggler score per host")
            .description(
                "Each host's own work per step over the other hosts' (1 is normal, 2 twice as slow; "
                "supervisor/signals/straggler.py): a host that turns hot is becoming a straggler."
            )
            .datasource(DATASOURCE)
            .with_target(query(f"max by (host) (slicekeeper_straggler_score{{{JOB}}})", "{{host}}"))
            .span(24)
            .height(9)
        )
        .with_panel(
            series(
                "Stragglers found",
                "1 while a host is flagged as a straggler (since its world last changed).",
                query(f"max by (host) (slicekeeper_straggler_flagged{{{JOB}}})", "host {{host}}"),
                minimum=0,
                maximum=1,
            )
        )
        .with_panel(
            series(
                "Step time per host (median)",
                "Median step time of each host over the interval; in a synchronous job all hosts wait "
                "for the slowest, so a straggler shows in its score, not here.",
                query(
                    "histogram_quantile(0.5, sum by (host, le) (rate("
                    f"slicekeeper_step_duration_seconds_bucket{{{JOB}}}[$__rate_interval]) * {HOST_ROLE}))",
                    "host {{host}}",
                ),
                unit="s",
            )
        )
        .with_panel(
            series(
                "Hangs and crashes per host",
                "Faults the leader put down to each host, by kind (a hang to the host that stopped, not "
                "to the one that noticed it).",
                query(
                    f"sum by (host, kind) (slicekeeper_host_faults_total{{{JOB}}} * {HOST_ROLE})",
                    "host {{host}}: {{kind}}",
                ),
                width=24,
            )
        )
    )
