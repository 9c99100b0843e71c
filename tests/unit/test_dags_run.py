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
