"""verify_views: every hour, prove the live views equal a replay of the log at the live position.

Thin: one task runs ``python -m pipelines.verify`` (the same entrypoint as by hand) in a child
process. A mismatch fails the run without retries (a verdict, not a glitch); the report is
``var/reports/verify/latest.json`` and ``latest.html``.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.sdk import Param, dag, task

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # tasks import the project's (light) infra package
    sys.path.insert(0, str(REPO))

DOC = """
### verify_views

Recomputes every view from the earliest offset up to the position P the live views cover (the
last committed micro-batch) with the same fold code, and compares them row for row; also Redis
against Delta and the accounting `read = applied + duplicates + quarantined`.

* Fails on any mismatch (no retries: rerunning gives the same answer).
* Report: `var/reports/verify/latest.json` (contract) and `latest.html` (readable, with a
  freshness plot); timestamped JSON copies beside them, pruned by `maintenance`.
* By hand: `python -m pipelines.verify [--namespace NS] [--topic T]`.
"""


@dag(
    dag_id="verify_views",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["kappa", "verify"],
    doc_md=DOC,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=2), "owner": "data-eng"},
    params={
        "namespace": Param("", type="string", description="views namespace; empty = the live one"),
        "topic": Param("", type="string", description="event topic; empty = SOCIAL_EVENTS_TOPIC"),
    },
)
def verify_views():
    @task(execution_timeout=timedelta(hours=1))
    def verify(**context) -> dict:
        from infra.airflow import TaskFailed, run_module
        from infra.settings import get_settings

        params = context["params"]
        args = [*(["--namespace", params["namespace"]] if params.get("namespace") else [])]
        args += ["--topic", params["topic"]] if params.get("topic") else []
        report_dir = Path(get_settings().reports_dir) / "verify"
        try:
            run_module("pipelines.verify", args)
        except TaskFailed as exc:
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(
                f"live views do not equal the replay: see {report_dir / 'latest.html'} ({exc})"
            ) from exc
        print(f"report: {report_dir / 'latest.json'}\nreadable: file://{report_dir / 'latest.html'}")
        return {"report": str(report_dir / "latest.json"), "html": str(report_dir / "latest.html")}

    verify()


verify_views()
