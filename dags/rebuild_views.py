"""rebuild_views: Kappa reprocessing (blue/green), triggered by hand.

Thin: each task runs one step of ``python -m pipelines.rebuild`` in a child process:
plan -> build (a fresh speed layer from the earliest offset into a new namespace) -> verify ->
switch (atomic pointer + restart of the stack's speed layer) -> retire versions past retention.
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
### rebuild_views

Computes a new version of every view from offset 0 with the current code into a new
namespace (its own Delta tables, checkpoint and Redis keys), verifies it against a replay of the
log, then switches the serving side atomically (`var/lake/ACTIVE` + Redis `active_namespace`,
which the API reads per request) and restarts the stack's speed layer on it, if it runs.

The old namespace is kept (frozen) for rollback until `maintenance` removes it after
`SOCIAL_NAMESPACE_RETENTION_DAYS`. Rollback: `python -m pipelines.rebuild rollback`.

Params: `namespace` (empty = next `vN`), `topic`, `switch` (false = build and verify only).
By hand: `python -m pipelines.rebuild run [--namespace NEW]`.
"""


@dag(
    dag_id="rebuild_views",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["kappa", "rebuild"],
    doc_md=DOC,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=2), "owner": "data-eng"},
    params={
        "namespace": Param("", type="string", description="new namespace; empty = the next vN"),
        "topic": Param("", type="string", description="event topic; empty = SOCIAL_EVENTS_TOPIC"),
        "switch": Param(True, type="boolean", description="switch the serving side when verified"),
    },
)
def rebuild_views():
    @task
    def plan(**context) -> str:
        from infra.settings import get_settings
        from pipelines.rebuild import NAME_RE, next_namespace

        name = context["params"].get("namespace") or next_namespace(get_settings())
        if not NAME_RE.match(name):
            raise ValueError(f"bad namespace name {name!r}")
        print(f"new namespace: {name}")
        return name

    def _topic(context) -> list[str]:
        topic = context["params"].get("topic")
        return ["--topic", topic] if topic else []

    @task(execution_timeout=timedelta(hours=6))
    def build(namespace: str, **context) -> str:
        from infra.airflow import run_module

        run_module("pipelines.rebuild", ["build", "--namespace", namespace, *_topic(context)])
        return namespace

    @task(execution_timeout=timedelta(hours=2))
    def verify(namespace: str, **context) -> str:
        from airflow.sdk.exceptions import AirflowFailException

        from infra.airflow import TaskFailed, run_module

        try:
            run_module("pipelines.rebuild", ["verify", "--namespace", namespace, *_topic(context)])
        except TaskFailed as exc:
            raise AirflowFailException(
                f"{namespace} does not verify; the live namespace is unchanged"
            ) from exc
        return namespace

    @task(retries=0)
    def switch(namespace: str, **context) -> None:
        from airflow.sdk.exceptions import AirflowSkipException

        from infra.airflow import run_module

        if not context["params"].get("switch", True):
            raise AirflowSkipException(f"switch=false: {namespace} built and verified, not live")
        run_module("pipelines.rebuild", ["switch", "--namespace", namespace, "--reason", "rebuild_views"])

    @task(trigger_rule="none_failed")
    def retire_old_versions() -> None:
        from infra.airflow import run_module

        run_module("pipelines.maintenance", ["--step", "namespaces", "--step", "checkpoints"])

    switch(verify(build(plan()))) >> retire_old_versions()


rebuild_views()
