"""verify_views: every hour and right after a rebuild's switch, prove the live views equal a replay of the log.

Thin: one task runs ``python -m pipelines.verify`` (the same entrypoint as by hand) in a child
process (:class:`infra.airflow_job.JobOperator`). A mismatch fails the run without retries (a
verdict, not a glitch); the report is ``var/reports/verify/latest.json`` and ``latest.html``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import Param, dag

from infra.airflow_job import JobOperator, on_cron_or_switch
from infra.airflow_notice import notify_failure

DOC = """
### verify_views

Replays the log up to the position P the live state covers (the keyed state's fences in Redis,
the Delta views' last committed micro-batch) with the same code into a scratch namespace, and
compares them key for key and row for row; also Redis against Delta and the accounting
`read = applied + duplicates + rejected + quarantined`.

* Runs hourly and whenever `rebuild_views` switches the live namespace (the `live_views` asset).
* Fails on any mismatch (no retries: rerunning gives the same answer).
* Report: `var/reports/verify/latest.json` (contract) and `latest.html` (readable, with a
  freshness plot); timestamped JSON copies beside them, pruned by `maintenance`.
* By hand: `social-verify [--namespace NS] [--topic T]` (`python -m pipelines.verify`).
"""


@dag(
    dag_id="verify_views",
    schedule=on_cron_or_switch("0 * * * *"),
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["kappa", "verify"],
    doc_md=DOC,
    default_args={
        "retries": 2,
        "retry_delay": timedelta(minutes=2),
        "owner": "data-eng",
        "on_failure_callback": notify_failure,
    },
    params={
        "namespace": Param("", type="string", description="views namespace; empty = the live one"),
        "topic": Param("", type="string", description="event topic; empty = SOCIAL_EVENTS_TOPIC"),
    },
)
def verify_views():
    JobOperator(
        task_id="verify",
        module="pipelines.verify",
        flag_params={"namespace": "--namespace", "topic": "--topic"},
        verdict="the live state does not equal the replay: see var/reports/verify/latest.html",
        report="verify/latest.html",
        execution_timeout=timedelta(hours=1),
    )


verify_views()
