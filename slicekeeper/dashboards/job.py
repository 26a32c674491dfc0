"""*Job goodput*: one TrainingJob, for the people who run it: is the money turned into training, and
where does the rest go."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import AnnotationQuery, Dashboard, Row

from slicekeeper.dashboards.panels import (
    DATASOURCE,
    JOB,
    figure,
    job_board,
    query,
    series,
)

RESTART_ANNOTATION = (
    f"changes(max by (namespace, trainingjob) (slicekeeper_job_generation{{{JOB}}})[2m:]) > 0"
)


def dashboard() -> Dashboard:
    return (
        job_board(
            "Job goodput",
            "job-goodput",
            "One TrainingJob: goodput, badput by category, progress, faults, recovery, checkpoints.",
        )
        .annotation(
            AnnotationQuery()
            .name("Restarts")
            .datasource(DATASOURCE)
            .expr(RESTART_ANNOTATION)
            .icon_color("red")
            .enable(True)
        )
        .with_row(Row("Goodput"))
        .with_panel(
            figure(
                "Goodput so far",
                "Productive step seconds over wall seconds of the job's hosts since it started, the "
                "report's figure (recording rule slicekeeper:job_goodput:ratio).",
                f"slicekeeper:job_goodput:ratio{{{JOB}}}",
                unit="percentunit",
            )
        )
        .with_panel(
            figure(
                "Step",
                "The furthest step the job completed.",
                f"max(slicekeeper_job_step{{{JOB}}})",
            )
        )
        .with_panel(
            figure(
                "Restarts",
                "Stops of the whole job since it started, every cause.",
                f"sum(max by (kind) (slicekeeper_job_restarts_total{{{JOB}}}))",
            )
        )
        .with_panel(
            figure(
                "Hot-swaps",
                "Hosts replaced by a spare or a new pod, restored from a peer or the persistent tier.",
                f"max(slicekeeper_job_hot_swaps_total{{{JOB}}})",
            )
        )
        .with_panel(
            series(
                "Goodput over time",
                "Over the last 5 minutes (rate) and since the job started (cumulative).",
                query(f"slicekeeper:job_goodput:ratio_rate5m{{{JOB}}}", "last 5 minutes"),
                query(f"slicekeeper:job_goodput:ratio{{{JOB}}}", "cumulative"),
                unit="percentunit",
                minimum=0,
                maximum=1,
            )
        )
        .with_panel(
            series(
                "Badput by category",
                "Seconds lost per second of wall time, summed over the hosts, stacked by category "
                "(docs/goodput.md): startup, initialization, checkpoints, recovery, repeated steps, "
                "scaled down.",
                query(f"slicekeeper:job_badput_seconds:rate5m{{{JOB}}}", "{{category}}"),
                unit="s",
                stacked=True,
            )
        )
        .with_row(Row("Progress"))
        .with_panel(
            series(
                "Steps per second",
                "The job's progress: new steps per second (steps trained again after a restore do not "
                "count).",
                query(f"slicekeeper:job_steps:rate5m{{{JOB}}}", "steps/s"),
            )
        )
        .with_panel(
            series(
                "Step time",
                "Median step time over the job's hosts, over 5 minutes.",
                query(f"slicekeeper:job_step_seconds:median5m{{{JOB}}}", "median"),
                unit="s",
            )
        )
        .with_row(Row("Faults and recovery"))
        .with_panel(
            series(
                "Restarts and faults by kind",
                "Job restarts and the faults the supervisors detected, by kind, per interval; the "
                "dashboard's red marks are the restarts.",
                query(
                    f"sum by (kind) (increase(slicekeeper_job_restarts_total{{{JOB}}}[$__rate_interval]))",
                    "restart: {{kind}}",
                ),
                query(
                    f"sum by (kind) (increase(slicekeeper_job_detections_total{{{JOB}}}[$__rate_interval]))",
                    "detected: {{kind}}",
                ),
                bars=True,
            )
        )
        .with_panel(
            series(
                "Time to recover per fault",
                "Mean seconds from a fault's detection until the job trained beyond where it stood, by "
                "kind (the report's detected -> productive).",
                query(
                    f"max by (kind) (slicekeeper_job_recovery_seconds_sum{{{JOB}}})"
                    f" / max by (kind) (slicekeeper_job_recovery_seconds_count{{{JOB}}})",
                    "{{kind}}",
                ),
                unit="s",
            )
        )
        .with_panel(
            series(
                "Slices: active and full",
                "Slices the job trains on now and slices it was written with: fewer while it runs "
                "scaled down, waiting for capacity.",
                query(f'max(slicekeeper_job_slices{{{JOB}, state="active"}})', "active"),
                query(f'max(slicekeeper_job_slices{{{JOB}, state="full"}})', "full"),
                minimum=0,
            )
        )
        .with_row(Row("Checkpoints"))
        .with_panel(
            series(
                "Checkpoint copies per minute, by tier",
                "Shards copied to a peer or the persistent tier (save) and back (restore), per minute.",
                query(
                    "sum by (tier, direction) (rate(slicekeeper_checkpoint_transfer_seconds_count"
                    f"{{{JOB}}}[$__rate_interval])) * 60",
                    "{{direction}} {{tier}}",
                ),
                width=8,
            )
        )
        .with_panel(
            series(
                "Checkpoint transfer time (p90)",
                "90th percentile time to copy one host's shard, by tier and direction.",
                query(
                    "histogram_quantile(0.9, sum by (tier, direction, le) "
                    f"(rate(slicekeeper_checkpoint_transfer_seconds_bucket{{{JOB}}}[$__rate_interval])))",
                    "{{direction}} {{tier}}",
                ),
                unit="s",
                width=8,
            )
        )
        .with_panel(
            series(
                "Checkpoint failures and restores, by tier",
                "Failed saves and copies, and restores of a host's shard by the tier it came from.",
                query(
                    "sum by (tier) (increase("
                    f"slicekeeper_checkpoint_failures_total{{{JOB}}}[$__rate_interval]))",
                    "failed: {{tier}}",
                ),
                query(
                    f"sum by (tier) (increase(slicekeeper_restores_total{{{JOB}}}[$__rate_interval]))",
                    "restored from: {{tier}}",
                ),
                bars=True,
                width=8,
            )
        )
    )
