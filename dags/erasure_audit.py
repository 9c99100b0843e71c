"""erasure_audit: every hour, the users erased since the last clean audit are audited.

Thin: one task runs ``python -m pipelines.erasure_audit`` in a child process
(:class:`infra.airflow_job.JobOperator`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import dag

from infra.airflow_job import JobOperator
from infra.airflow_notice import notify_failure

DOC = """
### erasure_audit

For each user erased since the last clean audit (the key store's tombstones, `var/keys/`): the
data key is gone, and no value sealed with it opens anywhere under the var dir (Kafka segments,
Delta files of every version, checkpoints, Redis files, reports, logs; decoded as their readers
decode them). Fails (no retry) when one does. The report: `var/reports/erasure_audit/erasures-latest.json`.
`docs/erasure.md` says what an erasure covers; `make erasure-audit` proves it end to end with a canary.

By hand: `python -m pipelines.erasure_audit [--user-id N]`.
"""


@dag(
    dag_id="erasure_audit",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["kappa", "erasure"],
    doc_md=DOC,
    default_args={
        "retries": 1,
        "retry_delay": timedelta(minutes=10),
        "owner": "data-eng",
        "on_failure_callback": notify_failure,
    },
)
def erasure_audit():
    JobOperator(
        task_id="audit",
        module="pipelines.erasure_audit",
        args=["--no-progress"],
        spark=False,  # reads files, Redis and the log as their own readers decode them
        report="erasure_audit/erasures-latest.json",
        execution_timeout=timedelta(hours=2),
    )


erasure_audit()
