"""The DAGs' behaviour, run with ``dag.test()`` on the private Airflow of tests/unit/conftest.py.

Each job task is a :class:`infra.airflow_job.JobOperator`; here its module is swapped for
``tests.unit.job_stub`` (exit status chosen per task, arguments recorded), so the DAGs' own
wiring runs for real: templated arguments, verdicts failing without retry, the switch skipped by
its param, the ``live_views`` asset emitted by a switch, and a timed-out job's process group gone.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import pytest

from infra.settings import REPO_ROOT

STUB = "tests.unit.job_stub"


@pytest.fixture
def dags(airflow_db):
    """A fresh parse of the DAG files for each test (a stubbed task stays in its own test)."""
    from airflow.dag_processing.dagbag import DagBag

    class Fresh:
        def __getitem__(self, dag_id: str):
            bag = DagBag(dag_folder=str(REPO_ROOT / "dags" / f"{dag_id}.py"))
            assert bag.import_errors == {}
            return bag.dags[dag_id]

    return Fresh()


@pytest.fixture
def calls(tmp_path, monkeypatch):
    """What the stub jobs were called with, in order: [(task's module args...), ...]."""
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("JOB_STUB_LOG", str(log))

    def read() -> list[list[str]]:
        return [json.loads(line)["args"] for line in log.read_text().splitlines()] if log.exists() else []

    return read


def stub(dag, **exit_codes: int) -> None:
    """Swap every job of ``dag`` for the stub; ``task_id=code`` sets a task's exit status (else 0)."""
    from infra.airflow_job import JobOperator

    for task in dag.tasks:
        if isinstance(task, JobOperator):
            task.args = [str(exit_codes.get(task.task_id, 0)), task.module, *task.args]
            task.module = STUB


def states(run) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


def tries(run, task_id: str) -> int:
    return next(ti.try_number for ti in run.get_task_instances() if ti.task_id == task_id)


def test_a_verdict_fails_the_run_at_once_without_retry(dags, calls):
    dag = dags["verify_views"]
    stub(dag, verify=1)
    assert dag.get_task("verify").retries == 2  # retries exist, and are not used for a verdict
    run = dag.test(run_conf={"namespace": "v3", "topic": ""})
    assert str(run.state) == "failed"
    assert states(run) == {"verify": "failed"}
    assert tries(run, "verify") == 1
    # the job ran once, with the params as flags (the empty topic left out)
    assert calls() == [["pipelines.verify", "--namespace", "v3"]]


def test_data_quality_passes_when_its_job_passes(dags, calls):
    dag = dags["data_quality"]
    stub(dag)
    run = dag.test(run_conf={"namespace": "", "topic": "t.x"})
    assert str(run.state) == "success" and states(run) == {"validate": "success"}
    assert calls() == [["pipelines.quality", "--topic", "t.x"]]


def test_rebuild_with_switch_false_skips_the_switch_and_still_retires(dags, calls):
    dag = dags["rebuild_views"]
    stub(dag)
    run = dag.test(run_conf={"namespace": "v7", "topic": "", "switch": False, "source": "batch"})
    assert states(run) == {
        "plan": "success",
        "build": "success",
        "verify": "success",
        "switch": "skipped",
        "retire_old_versions": "success",  # none_failed: a skipped switch is no failure
    }
    assert str(run.state) == "success"
    assert calls() == [
        ["pipelines.rebuild", "build", "--namespace", "v7", "--source", "batch"],  # plan's XCom, templated in
        ["pipelines.rebuild", "verify", "--namespace", "v7"],
        ["pipelines.maintenance", "--step", "namespaces", "--step", "checkpoints"],
    ]


def test_rebuild_that_does_not_verify_never_switches(dags, calls):
    dag = dags["rebuild_views"]
    stub(dag, verify=1)
    run = dag.test(run_conf={"namespace": "v8", "topic": "", "switch": True})
    assert str(run.state) == "failed"
    got = states(run)
    assert got["verify"] == "failed" and tries(run, "verify") == 1
    assert got["switch"] == "upstream_failed" and got["retire_old_versions"] == "upstream_failed"
    assert [c[1] for c in calls()] == ["build", "verify"]


def test_a_switch_emits_live_views_which_verify_and_quality_wait_for(dags, calls):
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    dag = dags["rebuild_views"]
    stub(dag)
    run = dag.test(run_conf={"namespace": "v9", "topic": "", "switch": True})
    assert states(run)["switch"] == "success"
    assert ["pipelines.rebuild", "switch", "--namespace", "v9", "--reason", "rebuild_views"] in calls()
    with create_session() as session:
        events = (
            session.query(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .filter(AssetModel.name == "live_views", AssetEvent.source_run_id == run.run_id)
            .all()
        )
    assert [e.source_task_id for e in events] == ["switch"]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie is gone too: it only waits for its parent to reap it
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1].startswith("Z")


def test_a_timed_out_job_is_stopped_with_its_whole_process_group(dags, tmp_path, calls):
    """execution_timeout -> on_kill: SIGTERM to the group (the driver and the JVM it started)."""
    dag = dags["verify_views"]
    task = dag.get_task("verify")
    stub(dag)
    task.args.append("--child")  # the job starts a child in its group, then both sleep 300 s
    task.execution_timeout = timedelta(seconds=5)
    task.retries = 0
    task.kill_grace_s = 5
    started = time.monotonic()
    run = dag.test(run_conf={"namespace": "", "topic": ""})
    assert str(run.state) == "failed"
    assert time.monotonic() - started < 120
    (record,) = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    deadline = time.monotonic() + 15
    while not (_gone(record["pid"]) and _gone(record["child"])) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _gone(record["pid"]), "the job outlived its task"
    assert _gone(record["child"]), "the job's child (its JVM) outlived its task"


def _notices(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_failed_run_sends_one_notice_where_the_connection_points(dags, calls, tmp_path, monkeypatch):
    """The connection given as an environment variable (Airflow's own secrets lookup) wins."""
    notices = tmp_path / "notices" / "failures.jsonl"
    monkeypatch.setenv(
        "AIRFLOW_CONN_SOCIAL_FAILURES", json.dumps({"conn_type": "fs", "extra": {"path": str(notices)}})
    )
    dag = dags["verify_views"]
    stub(dag, verify=1)
    run = dag.test(run_conf={"namespace": "", "topic": ""})
    assert str(run.state) == "failed"
    [sent] = _notices(notices)
    assert {k: sent[k] for k in ("dag_id", "task_id", "run_id", "try_number", "state")} == {
        "dag_id": "verify_views",
        "task_id": "verify",
        "run_id": run.run_id,
        "try_number": 1,
        "state": "failed",
    }
    assert "the live state does not equal the replay" in sent["error"]
    assert sent["report"].endswith("/reports/verify/latest.html")


def test_a_run_that_succeeds_sends_none(dags, calls, tmp_path, monkeypatch):
    notices = tmp_path / "failures.jsonl"
    monkeypatch.setenv(
        "AIRFLOW_CONN_SOCIAL_FAILURES", json.dumps({"conn_type": "fs", "extra": {"path": str(notices)}})
    )
    dag = dags["data_quality"]
    stub(dag)
    assert str(dag.test(run_conf={"namespace": "", "topic": ""}).state) == "success"
    assert not notices.exists()


def test_the_provisioned_connection_writes_under_var_airflow(dags, calls, monkeypatch):
    """Without a connection of the user's, `infra.airflow db` made one: a JSON line per failure in
    var/airflow/failures.jsonl (here the private Airflow's var)."""
    from tests.unit.conftest import AIRFLOW_SETTINGS

    monkeypatch.delenv("AIRFLOW_CONN_SOCIAL_FAILURES", raising=False)
    notices = AIRFLOW_SETTINGS.var_dir / "airflow" / "failures.jsonl"
    before = len(_notices(notices))
    dag = dags["erasure_audit"]
    stub(dag, audit=1)
    run = dag.test()
    assert str(run.state) == "failed"
    after = _notices(notices)
    assert len(after) == before + 1
    assert (after[-1]["dag_id"], after[-1]["task_id"], after[-1]["run_id"]) == (
        "erasure_audit",
        "audit",
        run.run_id,
    )


def test_a_notice_is_posted_to_an_http_connection(dags, calls, monkeypatch):
    """``http://host:port/path``: the notice is POSTed as JSON (a real HTTP server receives it)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    received: list[tuple[str, dict]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, json.loads(body)))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv(
            "AIRFLOW_CONN_SOCIAL_FAILURES", f"http://127.0.0.1:{server.server_port}/hooks/airflow"
        )
        dag = dags["batch_layer"]
        stub(dag, cross_check=1)
        run = dag.test(run_conf={"namespace": "", "upto": "archived"})
    finally:
        server.shutdown()
        server.server_close()
    assert str(run.state) == "failed"
    assert [(path, n["task_id"]) for path, n in received] == [("/hooks/airflow", "cross_check")]
    assert received[0][1]["report"] == ""  # the cross-check writes no page


def test_each_task_records_its_report_link_when_it_ends(dags, calls):
    """Airflow 3 computes the extra link in the worker as the task ends and keeps it as an XCom;
    read here as the API server's extra-links endpoint reads it: the serialized DAG's task, for
    the task instance in the metadata DB."""
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    from infra.airflow_job import report_url

    dag = dags["data_quality"]
    stub(dag)
    run = dag.test(run_conf={"namespace": "", "topic": ""})
    with create_session() as session:
        ti = (
            session.query(TaskInstance)
            .filter(TaskInstance.run_id == run.run_id, TaskInstance.task_id == "validate")
            .one()
        )
        task = SerializedDagModel.get_dag("data_quality", session=session).get_task("validate")
        assert list(task.extra_links) == ["Report"]
        assert task.get_extra_links(ti, "Report") == report_url("quality/index.html")


def test_the_spark_pool_is_provisioned_with_its_slots(airflow_db):
    from airflow.models.pool import Pool

    from infra.airflow_job import SPARK_POOL
    from tests.unit.conftest import AIRFLOW_SETTINGS

    pool = Pool.get_pool(SPARK_POOL)
    assert pool is not None and pool.slots == AIRFLOW_SETTINGS.airflow_spark_slots == 1
