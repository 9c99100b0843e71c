"""data_quality: every day and right after a rebuild's switch, the Great Expectations checkpoints.

Thin: one task runs ``python -m pipelines.quality`` in a child process
(:class:`infra.airflow_job.JobOperator`). Suites and checkpoints are GX's own files in
``quality/``; Data Docs under ``var/reports/quality/``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import Param, dag

from infra.airflow_job import JobOperator, on_cron_or_switch
from infra.airflow_notice import notify_failure

DOC = """
### data_quality

Runs every named GX checkpoint of the File Data Context in `quality/`: schema and types,
non-null and unique keys, ranges, `event_id` unique among non-duplicates, timelines reference
live posts of followed authors, `unread_counts` equals the unread inbox rows (failures name the
user), accounting, quarantine rate (`SOCIAL_QUALITY_MAX_QUARANTINE_PCT`) and freshness
(`SOCIAL_QUALITY_MAX_STALENESS_S`).

* Runs daily and whenever `rebuild_views` switches the live namespace (the `live_views` asset).
* Fails when any checkpoint fails (no retries); Data Docs: `var/reports/quality/index.html`,
  summary: `var/reports/quality/latest.json`.
* By hand: `social-quality [--namespace NS] [--suite NAME]` (`python -m pipelines.quality`).
"""


@dag(
    dag_id="data_quality",
    schedule=on_cron_or_switch("0 0 * * *"),
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["kappa", "quality"],
    doc_md=DOC,
    default_args={
        "retries": 2,
        "retry_delay": timedelta(minutes=5),
        "owner": "data-eng",
        "on_failure_callback": notify_failure,
    },
    params={
        "namespace": Param("", type="string", description="views namespace; empty = the live one"),
        "topic": Param("", type="string", description="event topic (freshness); empty = SOCIAL_EVENTS_TOPIC"),
    },
)
def data_quality():
    JobOperator(
        task_id="validate",
        module="pipelines.quality",
        flag_params={"namespace": "--namespace", "topic": "--topic"},
        verdict="a data-quality checkpoint failed: see var/reports/quality/index.html",
        report="quality/index.html",
        execution_timeout=timedelta(hours=1),
    )


data_quality()
