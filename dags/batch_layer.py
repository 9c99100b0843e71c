"""batch_layer: Lambda's batch layer, every hour: every view recomputed from the Delta archive.

Thin: each task runs a ``python -m`` entrypoint in a child process
(:class:`infra.airflow_job.JobOperator`):
recompute (``pipelines.batch_layer``: the archive up to what it covers -> ``<ns>-batch``), then
cross-check (``pipelines.batch_layer.verify``: the live keyed state == the batch layer at the
live state's position).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import Param, dag

from infra.airflow_job import JobOperator
from infra.airflow_notice import notify_failure

DOC = """
### batch_layer

The Lambda architecture's batch layer: every view (follows, posts, home timelines with the
hybrid fan-out rule, inbox, unread counts, status, users, celebrities, the disposition of every
record and the accounting) recomputed set-wise from the Delta archive (`events_bronze`,
`quarantine`) up to the log position P it covers, into the namespace `<ns>-batch`, with P in
every Delta commit's `userMetadata`. Its staleness is this schedule plus its run time (see the
docs/experiments.md, "Lambda vs Kappa").

Then the cross-check: the live keyed state in Redis against the batch layer at the live state's
position; a disagreement fails the run (no retries: a verdict) and names view, key, both values.
Beside it, the data-quality suites on the batch views (`social-quality --batch`), as
`data_quality` runs them on the live ones.

* By hand: `python -m pipelines.batch_layer --namespace v1 --upto archived` and
  `python -m pipelines.batch_layer.verify --namespace v1`.
"""


@dag(
    dag_id="batch_layer",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["lambda", "batch"],
    doc_md=DOC,
    default_args={
        "retries": 1,
        "retry_delay": timedelta(minutes=2),
        "owner": "data-eng",
        "on_failure_callback": notify_failure,
    },
    params={
        "namespace": Param("", type="string", description="archive namespace; empty = the live one"),
        "upto": Param("archived", type="string", description="'archived' or JSON {partition: end offset}"),
    },
)
def batch_layer():
    recompute = JobOperator(
        task_id="recompute",
        module="pipelines.batch_layer",
        flag_params={"namespace": "--namespace", "upto": "--upto"},
        execution_timeout=timedelta(hours=2),
    )
    cross_check = JobOperator(
        task_id="cross_check",
        module="pipelines.batch_layer.verify",
        flag_params={"namespace": "--namespace"},
        verdict="the keyed state and the batch layer disagree: see var/reports/verify/",
        execution_timeout=timedelta(hours=1),
    )
    quality = JobOperator(
        task_id="quality",
        module="pipelines.quality",
        args=["--batch"],
        flag_params={"namespace": "--namespace"},
        verdict="a data-quality checkpoint failed on the batch views: see var/reports/quality/index.html",
        report="quality/index.html",
        execution_timeout=timedelta(hours=1),
    )
    recompute >> [cross_check, quality]


batch_layer()
