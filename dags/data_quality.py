"""data_quality: every day, Great Expectations checkpoints over the event archive and every view.

Thin: one task runs ``python -m pipelines.quality`` in a child process. Suites are data in
``quality/expectations/``; Data Docs under ``var/reports/quality/``.
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
### data_quality

One GX checkpoint per suite in `quality/expectations/`: schema and types, non-null and unique
keys, ranges, `event_id` unique among non-duplicates, timelines reference live posts of followed
authors, `unread_counts` equals the unread inbox rows, accounting, quarantine rate
(`SOCIAL_QUALITY_MAX_QUARANTINE_PCT`) and freshness (`SOCIAL_QUALITY_MAX_STALENESS_S`).

* Fails when any suite fails (no retries); Data Docs: `var/reports/quality/index.html`,
  summary: `var/reports/quality/latest.json`.
* By hand: `python -m pipelines.quality [--namespace NS] [--suite NAME]`.
"""


@dag(
    dag_id="data_quality",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["kappa", "quality"],
    doc_md=DOC,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5), "owner": "data-eng"},
    params={
        "namespace": Param("", type="string", description="views namespace; empty = the live one"),
        "topic": Param("", type="string", description="event topic (freshness); empty = SOCIAL_EVENTS_TOPIC"),
    },
)
def data_quality():
    @task(execution_timeout=timedelta(hours=1))
    def validate(**context) -> dict:
        from infra.airflow import TaskFailed, run_module
        from infra.settings import get_settings

        params = context["params"]
        args = [*(["--namespace", params["namespace"]] if params.get("namespace") else [])]
        args += ["--topic", params["topic"]] if params.get("topic") else []
        docs = Path(get_settings().reports_dir) / "quality"
        try:
            run_module("pipelines.quality", args)
        except TaskFailed as exc:
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(
                f"a data-quality suite failed: see {docs / 'index.html'} ({exc})"
            ) from exc
        print(f"Data Docs: file://{docs / 'index.html'}")
        return {"data_docs": str(docs / "index.html"), "summary": str(docs / "latest.json")}

    validate()


data_quality()
