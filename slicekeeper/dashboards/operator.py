"""*Operator*: the slicekeeper operator itself, for the people who run the cluster: how fast it
reconciles, what it asks of the API server, the pods it keeps and the hot-swaps it made."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from slicekeeper.dashboards.panels import board, query, series


def dashboard() -> Dashboard:
    return (
        board(
            "Operator",
            "operator",
            "The operator: reconcile latency, API requests and errors, pods by phase, hot-swaps.",
        )
        .with_panel(
            series(
                "Reconcile latency by handler (p50, p99)",
                "Time in each kopf handler: create/resume/update, the status timer, pod and node "
                "events, delete.",
                query(
                    "histogram_quantile(0.5, sum by (handler, le) "
                    "(rate(slicekeeper_operator_reconcile_seconds_bucket[$__rate_interval])))",
                    "p50 {{handler}}",
                ),
                query(
                    "histogram_quantile(0.99, sum by (handler, le) "
                    "(rate(slicekeeper_operator_reconcile_seconds_bucket[$__rate_interval])))",
                    "p99 {{handler}}",
                ),
                unit="s",
            )
        )
        .with_panel(
            series(
                "API requests by verb",
                "Requests the operator made of the API server per second, by verb, and the ones that failed.",
                query(
                    "sum by (verb) (rate(slicekeeper_operator_api_requests_total[$__rate_interval]))",
                    "{{verb}}",
                ),
                query(
                    "sum by (verb, code) (rate(slicekeeper_operator_api_errors_total[$__rate_interval]))",
                    "failed {{verb}} {{code}}",
                ),
                unit="reqps",
            )
        )
        .with_panel(
            series(
                "Pods by phase",
                "The TrainingJobs' pods the operator keeps, by phase.",
                query("sum by (phase) (slicekeeper_operator_pods)", "{{phase}}"),
                stacked=True,
            )
        )
        .with_panel(
            series(
                "Jobs by phase, hot-swaps and scale events",
                "TrainingJobs by phase; pods the operator replaced (hot-swaps) and the scale events it "
                "recorded, per interval.",
                query("sum by (phase) (slicekeeper_operator_jobs)", "jobs {{phase}}"),
                query("sum(increase(slicekeeper_operator_hot_swaps_total[$__rate_interval]))", "hot-swaps"),
                query(
                    "sum by (kind) (increase(slicekeeper_operator_scale_events_total[$__rate_interval]))",
                    "scaled {{kind}}",
                ),
            )
        )
    )
