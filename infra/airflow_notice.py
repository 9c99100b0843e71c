"""Failure notices of the DAGs: an Airflow notifier whose destination is an Airflow connection.

Every DAG task carries :data:`notify_failure` as its ``on_failure_callback``: when a task fails for
good (a verdict at once, anything else once its retries are spent), the notifier reads the
connection :data:`CONNECTION_ID` and sends one JSON notice (dag, task, run, try, the error, the
task's report link) to where it points:

* ``conn_type`` ``fs`` (Airflow's file-system connection), ``extra`` ``{"path": ...}``: appended
  to that file as one JSON line. ``python -m infra.airflow db`` creates this one, pointing at
  ``var/airflow/failures.jsonl``, when the connection does not exist yet.
* ``conn_type`` ``http`` or ``https``: POSTed as JSON to ``<type>://<host>[:<port>]/<schema>``
  (``AIRFLOW_CONN_SOCIAL_FAILURES='http://127.0.0.1:9000/hooks/airflow'``, or ``airflow
  connections add``): a chat webhook, an alert manager, a small relay.

A notice that cannot be sent is logged by the task runner and fails nothing: the task's own state
is the record. Light: no pyspark, no great_expectations (the DAG files import it).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from airflow.sdk import BaseHook, BaseNotifier

CONNECTION_ID = "social_failures"
FILE_TYPES = ("fs", "file")
HTTP_TYPES = ("http", "https")
POST_TIMEOUT_S = 10.0


def notice(context) -> dict:
    """The notice of one failed task, from its callback's context."""
    ti = context["ti"]
    task = context.get("task")
    error = context.get("exception")
    link = ""
    if task is not None and getattr(task, "report", None):
        from infra.airflow_job import report_url

        link = report_url(task.report)
    return {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "dag_id": ti.dag_id,
        "task_id": ti.task_id,
        "run_id": ti.run_id,
        "try_number": ti.try_number,
        "state": "failed",
        "error": (str(error).strip().splitlines() or [type(error).__name__])[0][:500] if error else "",
        "report": link,
    }


def send(conn, body: dict) -> str:
    """Send ``body`` where the connection ``conn`` points; returns where it went."""
    if conn.conn_type in FILE_TYPES:
        path = Path(conn.extra_dejson.get("path") or f"/{conn.schema or ''}")
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(json.dumps(body) + "\n")
        return str(path)
    if conn.conn_type in HTTP_TYPES:
        from urllib.request import Request, urlopen

        port = f":{conn.port}" if conn.port else ""
        url = f"{conn.conn_type}://{conn.host}{port}/{(conn.schema or '').lstrip('/')}"
        request = Request(
            url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
        )
        with urlopen(request, timeout=POST_TIMEOUT_S):  # an HTTP error status raises
            pass
        return url
    raise ValueError(
        f"connection {conn.conn_id!r}: conn_type {conn.conn_type!r} is not one of {FILE_TYPES + HTTP_TYPES}"
    )


class FailureNotice(BaseNotifier):
    """One JSON notice per failed task, sent where the Airflow connection ``conn_id`` points."""

    template_fields = ("conn_id",)

    def __init__(self, conn_id: str = CONNECTION_ID):
        super().__init__()
        self.conn_id = conn_id

    def notify(self, context) -> None:
        where = send(BaseHook.get_connection(self.conn_id), notice(context))
        self.log.info("failure notice sent to %s", where)


notify_failure = FailureNotice()


def default_connection(var_dir: Path) -> dict:
    """The connection ``python -m infra.airflow db`` creates when none exists (Airflow's JSON form)."""
    return {
        "conn_type": "fs",
        "description": "failure notices of the DAGs, one JSON line each (infra/airflow_notice.py)",
        "extra": {"path": str(Path(var_dir) / "airflow" / "failures.jsonl")},
    }
