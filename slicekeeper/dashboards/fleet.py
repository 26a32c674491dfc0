"""*Fleet*: every TrainingJob at once, for the platform's owner: which jobs turn their chips into
training, which do not, and what holds each one back."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from slicekeeper.dashboards.panels import board, figure, listing, query, series

BY_JOB = "namespace, trainingjob"


def dashboard() -> Dashboard:
    return (
        board(
            "Fleet",
            "fleet",
            "Every TrainingJob: goodput, state, chips and the category that costs it most.",
            refresh="1m",
            since="now-24h",
        )
        .with_panel(
            figure(
                "Jobs running",
                "TrainingJobs whose leader reports them running.",
                f'count(max by ({BY_JOB}) (slicekeeper_job_state{{state="running"}}) == 1) or vector(0)',
            )
        )
        .with_panel(
            figure(
                "Chips in jobs",
                "Chips (devices) of every running job as written, scaled-down slices included.",
                f'sum(max by ({BY_JOB}) (slicekeeper_job_devices{{state="full"}})) or vector(0)',
            )
        )
        .with_panel(
            figure(
                "Fleet goodput, last hour",
                "Productive seconds over wall seconds of every job's hosts over the last hour.",
                "sum(rate(slicekeeper_productive_seconds_total[1h])"
                ' * on (namespace, pod) group_left () slicekeeper_host_info{role="host"})'
                " / sum((rate(slicekeeper_productive_seconds_total[1h])"
                " + on (namespace, pod) group_left ()"
                " sum by (namespace, pod) (rate(slicekeeper_badput_seconds_total[1h])))"
                ' * on (namespace, pod) group_left () slicekeeper_host_info{role="host"})',
                unit="percentunit",
            )
        )
        .with_panel(
            figure(
                "Jobs scaled down",
                "Jobs training on fewer slices than written.",
                f'count(max by ({BY_JOB}) (slicekeeper_job_slices{{state="active"}})'
                f' < max by ({BY_JOB}) (slicekeeper_job_slices{{state="full"}})) or vector(0)',
            )
        )
        .with_panel(
            listing(
                "Jobs",
                "One row per job: goodput so far, its state, its chips, and the badput category that "
                "cost it most over the last 5 minutes.",
                query("slicekeeper:job_goodput:ratio", "goodput", instant=True),
                query(f"max by ({BY_JOB}, state) (slicekeeper_job_state == 1)", "state", instant=True),
                query(f'max by ({BY_JOB}) (slicekeeper_job_devices{{state="full"}})', "chips", instant=True),
                query(
                    f"topk by ({BY_JOB}) (1, slicekeeper:job_badput_seconds:rate5m)", "badput", instant=True
                ),
            )
        )
        .with_panel(
            series(
                "Goodput by job",
                "Each job's goodput over the last 5 minutes.",
                query("slicekeeper:job_goodput:ratio_rate5m", "{{namespace}}/{{trainingjob}}"),
                unit="percentunit",
                width=24,
                minimum=0,
                maximum=1,
            )
        )
    )
