"""DAG-bag guard: the DAGs import cleanly, carry tags, retries and docs, and stay thin.

Importing a DAG file must not import Spark or Great Expectations: the scheduler parses these
files every few seconds, and every task runs its job in a child process.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from infra.settings import REPO_ROOT

DAG_IDS = {"verify_views", "rebuild_views", "data_quality", "maintenance", "batch_layer", "erasure_audit"}
HEAVY = ("pyspark", "great_expectations", "delta", "pandas", "confluent_kafka")


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag  # the private AIRFLOW_HOME of tests/unit/conftest.py

    return DagBag(dag_folder=str(REPO_ROOT / "dags"))


def test_no_import_errors_and_every_dag_is_there(dagbag):
    assert dagbag.import_errors == {}
    assert DAG_IDS <= set(dagbag.dag_ids)


def test_tags_retries_docs(dagbag):
    for dag_id in DAG_IDS:
        dag = dagbag.dags[dag_id]
        assert dag.tags, dag_id
        assert dag.doc_md and len(dag.doc_md) > 100, dag_id
        assert dag.max_active_runs == 1, dag_id  # replays/rebuilds of one namespace never overlap
        for t in dag.tasks:
            if t.task_id != "switch":  # the switch is not retried blindly: it is an atomic decision
                assert t.retries >= 1, f"{dag_id}.{t.task_id}"


def test_schedules(dagbag):
    from infra.airflow_job import LIVE_VIEWS

    assert dagbag.dags["rebuild_views"].schedule is None  # manual only
    assert dagbag.dags["maintenance"].schedule == "@daily"
    assert dagbag.dags["batch_layer"].schedule == "@hourly"
    assert dagbag.dags["erasure_audit"].schedule == "@hourly"
    # verify and quality: on their clock, and right after a rebuild's switch (the live_views asset)
    for dag_id, cron in (("verify_views", "0 * * * *"), ("data_quality", "0 0 * * *")):
        timetable = dagbag.dags[dag_id].timetable
        assert timetable.timetable.expression == cron, dag_id
        assert list(timetable.asset_condition.objects) == [LIVE_VIEWS], dag_id
    assert dagbag.dags["rebuild_views"].get_task("switch").outlets == [LIVE_VIEWS]


def test_every_job_task_is_a_job_operator(dagbag):
    from infra.airflow_job import JobOperator

    for dag_id in DAG_IDS:
        for t in dagbag.dags[dag_id].tasks:
            if t.task_id != "plan":  # rebuild's plan only names the namespace, in-process
                assert isinstance(t, JobOperator), f"{dag_id}.{t.task_id}"


# the tasks that start no Spark driver: every other task of the DAGs is in the spark pool
NO_SPARK = {
    ("rebuild_views", "plan"),
    ("rebuild_views", "switch"),
    ("rebuild_views", "retire_old_versions"),
    ("maintenance", "namespaces"),
    ("maintenance", "reports"),
    ("maintenance", "checkpoints"),
    ("maintenance", "logs"),
    ("erasure_audit", "audit"),
}
# the page each task's job writes, under var/reports/: its "Report" link
REPORTS = {
    ("verify_views", "verify"): "verify/latest.html",
    ("rebuild_views", "verify"): "verify/latest.html",
    ("data_quality", "validate"): "quality/index.html",
    ("batch_layer", "quality"): "quality/index.html",
    ("erasure_audit", "audit"): "erasure_audit/erasures-latest.json",
}


def _tasks(dagbag):
    return [(dag_id, t) for dag_id in sorted(DAG_IDS) for t in dagbag.dags[dag_id].tasks]


def test_every_spark_task_is_in_the_spark_pool_and_no_other(dagbag):
    from infra.airflow_job import SPARK_POOL

    assert {(d, t.task_id) for d, t in _tasks(dagbag)} >= NO_SPARK  # no stale entry
    for dag_id, t in _tasks(dagbag):
        wanted = "default_pool" if (dag_id, t.task_id) in NO_SPARK else SPARK_POOL
        assert t.pool == wanted, f"{dag_id}.{t.task_id}: pool {t.pool!r}"
        assert t.pool_slots == 1


def test_every_job_task_links_to_the_report_it_writes(dagbag):
    from infra.airflow_job import ReportLink, report_url

    for dag_id, t in _tasks(dagbag):
        if t.task_id == "plan":
            continue
        assert [type(link) for link in t.operator_extra_links] == [ReportLink], f"{dag_id}.{t.task_id}"
        assert t.report == REPORTS.get((dag_id, t.task_id)), f"{dag_id}.{t.task_id}"
        link = ReportLink().get_link(t, ti_key=None)
        assert link == (report_url(t.report) if t.report else ""), f"{dag_id}.{t.task_id}"
    assert report_url("verify/latest.html").endswith("/reports/verify/latest.html")


def test_every_task_sends_a_failure_notice(dagbag):
    from infra.airflow_notice import CONNECTION_ID, FailureNotice

    for dag_id, t in _tasks(dagbag):
        notifiers = [c for c in t.on_failure_callback if isinstance(c, FailureNotice)]
        assert len(notifiers) == 1, f"{dag_id}.{t.task_id}: {t.on_failure_callback}"
        assert notifiers[0].conn_id == CONNECTION_ID


def test_batch_layer_order(dagbag):
    assert dagbag.dags["batch_layer"].get_task("cross_check").upstream_task_ids == {"recompute"}
    quality = dagbag.dags["batch_layer"].get_task("quality")
    assert quality.upstream_task_ids == {"recompute"}
    assert quality.command({"namespace": "v3"})[-4:] == ["pipelines.quality", "--batch", "--namespace", "v3"]


def test_rebuild_order(dagbag):
    dag = dagbag.dags["rebuild_views"]
    assert dag.get_task("build").upstream_task_ids == {"plan"}
    assert dag.get_task("verify").upstream_task_ids == {"build"}
    assert dag.get_task("switch").upstream_task_ids == {"verify"}


# One child process imports the DAG files one after another, as the scheduler's parser does, and
# looks after each for a heavy module: the first file that pulls one in is named (a module one
# file imported stays imported, so a later file needing it too is not). A child per file paid the
# Airflow import each time: one file 2.7 CPU-s, all six in one child 2.6 (quiet machine, 2026-11-28).
LIGHT_CHECK = """
import json, runpy, sys
found = {}
for path in sys.argv[2:]:
    runpy.run_path(path)
    heavy = [m for m in json.loads(sys.argv[1]) if m in sys.modules]
    if heavy:
        found[path] = heavy
        break
print(json.dumps(found))
"""


def test_importing_the_dag_files_stays_light():
    paths = [str(REPO_ROOT / "dags" / f"{name}.py") for name in sorted(DAG_IDS)]
    done = subprocess.run(
        [sys.executable, "-c", LIGHT_CHECK, json.dumps(HEAVY), *paths],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {}, done.stdout


def test_the_api_server_serves_the_reports_the_links_point_at(tmp_path):
    """The plugin of infra/airflow_plugins/ mounts var/reports/ at /reports/ (through Airflow's own
    plugin loading and mounting), and a link's URL path opens the page its job wrote."""
    from urllib.parse import urlsplit

    from airflow import plugins_manager
    from airflow.api_fastapi.app import init_plugins
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from infra.airflow_job import REPORTS_PREFIX, report_url
    from infra.airflow_plugins.social_reports import reports_app

    apps, _ = plugins_manager.get_fastapi_plugins()
    assert [a["name"] for a in apps if a["url_prefix"] == REPORTS_PREFIX] == ["kappa-social reports"]
    api = FastAPI()
    init_plugins(api)
    assert REPORTS_PREFIX in [getattr(route, "path", None) for route in api.routes]

    (tmp_path / "verify").mkdir()
    (tmp_path / "verify" / "latest.html").write_text("<h1>verify</h1>")
    (tmp_path / "quality").mkdir()
    (tmp_path / "quality" / "index.html").write_text("data docs")
    served = FastAPI()
    served.mount(REPORTS_PREFIX, reports_app(tmp_path))
    client = TestClient(served)
    assert client.get(urlsplit(report_url("verify/latest.html")).path).text == "<h1>verify</h1>"
    assert client.get(urlsplit(report_url("quality/")).path).text == "data docs"  # Data Docs' index
    assert client.get("/reports/verify/missing.html").status_code == 404
