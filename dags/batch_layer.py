"""batch_layer: Lambda's batch layer, every hour: every view recomputed from the Delta archive.

Thin: each task runs a ``python -m`` entrypoint in a child process (``infra.airflow.run_module``):
recompute (``pipelines.batch_layer``: the archive up to what it covers -> ``<ns>-batch``), then
cross-check (``pipelines.batch_layer.verify``: the live keyed state == the batch layer at the
live state's position).
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.sdk import Param, dag, task

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DOC = """
### batch_layer

The Lambda architecture's batch layer: every view (follows, posts, home timelines with the
hybrid fan-out rule, inbox, unread counts, status, users, celebrities, the disposition of every
record and the accounting) recomputed set-wise from the Delta archive (`events_bronze`,
`quarantine`) up to the log position P it covers, into the namespace `<ns>-batch`, with P in
every Delta commit's `userMetadata`. Its staleness is this schedule plus its run time (see the
README, "Lambda vs Kappa").

Then the cross-check: the live keyed state in Redis against the batch layer at the live state's
position; a disagreement fails the run (no retries: a verdict) and names view, key, both values.

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
    default_args={"retries": 1, "retry_delay": timedelta(minutes=2), "owner": "data-eng"},
    params={
        "namespace": Param("", type="string", description="archive namespace; empty = the live one"),
        "upto": Param("archived", type="string", description="'archived' or JSON {partition: end offset}"),
    },
)
def batch_layer():
    def _ns(context) -> list[str]:
        ns = context["params"].get("namespace")
        return ["--namespace", ns] if ns else []

    @task(execution_timeout=timedelta(hours=2))
    def recompute(**context) -> None:
        from infra.airflow import run_module

        run_module(
            "pipelines.batch_layer", [*_ns(context), "--upto", context["params"].get("upto") or "archived"]
        )

    @task(execution_timeout=timedelta(hours=1))
    def cross_check(**context) -> None:
        from airflow.sdk.exceptions import AirflowFailException

        from infra.airflow import TaskFailed, run_module

        try:
            run_module("pipelines.batch_layer.verify", _ns(context))
        except TaskFailed as exc:
            raise AirflowFailException(f"the keyed state and the batch layer disagree ({exc})") from exc

    recompute() >> cross_check()


batch_layer()
