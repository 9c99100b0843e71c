"""rebuild_views: reprocessing (blue/green) from either path, triggered by hand.

Thin: ``plan`` names the new namespace; every other task runs one step of
``python -m pipelines.rebuild`` in a child process (:class:`infra.airflow_job.JobOperator`):
build (``source=kappa``: a fresh speed layer from the earliest offset into a new namespace;
``source=batch``: the batch layer's views at the archived position, then the log after it)
-> verify -> switch
(atomic pointer + restart of the stack's speed layer; emits the ``live_views`` asset) -> retire
versions past retention.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import Param, dag, task

from infra.airflow_job import LIVE_VIEWS, JobOperator
from infra.airflow_notice import notify_failure

DOC = """
### rebuild_views

Computes a new version of every view with the current code into a new namespace (its own
Delta tables, checkpoint and Redis keys), from either path (param `source`):

* `kappa` (default): a fresh speed layer replays the log from offset 0;
* `batch`: the batch layer recomputes every view set-wise from the live namespace's Delta archive
  up to the position P it covers (into `<new>-batch`), those views seed the new namespace (Delta
  tables and Redis, `python -m pipelines.restore --from-batch`), and its speed layer reads only
  the log after P.

Either way it verifies the new namespace against a replay of the whole log, then switches the serving side atomically (`var/lake/ACTIVE` + Redis `active_namespace`,
which the API reads per request) and restarts the stack's speed layer on it, if it runs.
The switch updates the `live_views` asset: `verify_views` and `data_quality` run right after it.

The old namespace is kept (frozen) for rollback until `maintenance` removes it after
`SOCIAL_NAMESPACE_RETENTION_DAYS`. Rollback: `social-rebuild rollback` (`python -m pipelines.rebuild`).

Params: `namespace` (empty = next `vN`), `source` (`kappa` or `batch`), `topic`, `switch` (false =
build and verify only; the switch is then skipped).
By hand: `social-rebuild run [--namespace NEW] [--source batch]`.
"""

NEW = "{{ ti.xcom_pull(task_ids='plan') }}"


@dag(
    dag_id="rebuild_views",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["kappa", "lambda", "rebuild"],
    doc_md=DOC,
    default_args={
        "retries": 1,
        "retry_delay": timedelta(minutes=2),
        "owner": "data-eng",
        "on_failure_callback": notify_failure,
    },
    params={
        "namespace": Param("", type="string", description="new namespace; empty = the next vN"),
        "source": Param(
            "kappa",
            type="string",
            enum=["kappa", "batch"],
            description="kappa: replay the log from offset 0; batch: the batch layer's views, then the log after them",
        ),
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

    build = JobOperator(
        task_id="build",
        module="pipelines.rebuild",
        args=["build", "--namespace", NEW],
        flag_params={"topic": "--topic", "source": "--source"},
        execution_timeout=timedelta(hours=6),
    )
    verify = JobOperator(
        task_id="verify",
        module="pipelines.rebuild",
        args=["verify", "--namespace", NEW],
        flag_params={"topic": "--topic"},
        verdict="the new namespace does not verify; the live namespace is unchanged",
        report="verify/latest.html",
        execution_timeout=timedelta(hours=2),
    )
    switch = JobOperator(
        task_id="switch",
        module="pipelines.rebuild",
        args=["switch", "--namespace", NEW, "--reason", "rebuild_views"],
        enabled_param="switch",
        spark=False,  # a pointer and the speed layer's restart, no Spark job
        retries=0,  # an atomic decision, not retried blindly
        outlets=[LIVE_VIEWS],
    )
    retire = JobOperator(
        task_id="retire_old_versions",
        module="pipelines.maintenance",
        args=["--step", "namespaces", "--step", "checkpoints"],
        spark=False,  # files and Redis keys
        trigger_rule="none_failed",  # also after a skipped switch
    )
    plan() >> build >> verify >> switch >> retire


rebuild_views()
