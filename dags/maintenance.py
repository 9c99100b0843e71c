"""maintenance: every day, Delta OPTIMIZE + VACUUM, retired namespaces, old reports, checkpoints.

Thin: each task runs one step of ``python -m pipelines.maintenance`` in a child process
(:class:`infra.airflow_job.JobOperator`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import dag

from infra.airflow_job import JobOperator
from infra.airflow_notice import notify_failure

DOC = """
### maintenance

* `optimize`: compaction of the live namespace's append-only tables (safe beside the running
  stream) and of every table of frozen namespaces.
* `vacuum`: keeps `SOCIAL_DELTA_RETENTION_HOURS` (default 168 h) of time travel.
* `namespaces`: removes views namespaces replaced more than `SOCIAL_NAMESPACE_RETENTION_DAYS` ago
  (never the live one or the rollback target): tables, checkpoint, Redis keys.
* `reports`: prunes reports and Airflow logs older than `SOCIAL_REPORT_RETENTION_DAYS`.
* `checkpoints`: removes Spark checkpoints of namespaces that no longer exist, stale temp files.

By hand: `social-maintenance [--step NAME] [--dry-run]` (`python -m pipelines.maintenance`).
"""


# the steps that start a Spark driver (Delta's OPTIMIZE and VACUUM); the others sweep files and keys
SPARK_STEPS = ("optimize", "vacuum")


def _step(name: str) -> JobOperator:
    return JobOperator(
        task_id=name,
        module="pipelines.maintenance",
        args=["--step", name],
        spark=name in SPARK_STEPS,
        execution_timeout=timedelta(hours=2),
    )


@dag(
    dag_id="maintenance",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["kappa", "maintenance"],
    doc_md=DOC,
    default_args={
        "retries": 2,
        "retry_delay": timedelta(minutes=10),
        "owner": "data-eng",
        "on_failure_callback": notify_failure,
    },
)
def maintenance():
    # vacuum after optimize: the files a compaction replaced become vacuumable after the retention
    compacted = _step("optimize")
    vacuumed = _step("vacuum")
    compacted >> vacuumed >> [_step("namespaces"), _step("reports"), _step("checkpoints"), _step("logs")]


maintenance()
