"""The Airflow UI as a person gets it: `SOCIAL_AIRFLOW_STANDALONE=1 make up` (or `make airflow`).

`airflow standalone` started by the stack's AirflowService on a private port and var dir; then,
through Airflow's own REST API (what the UI's DAG list page reads): every DAG listed, paused at
creation, no login needed; the UI page itself served; and a triggered run really runs its task
(scheduler -> executor -> the task's job in a child process) with the project's settings.
"""

from __future__ import annotations

import time

import httpx
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAG_IDS = {"verify_views", "rebuild_views", "data_quality", "maintenance", "batch_layer", "erasure_audit"}


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    from infra.stack import AirflowService, Stack
    from tests.conftest import _free_port, isolated_settings

    settings = isolated_settings(
        tmp_path_factory.mktemp("airflow-var"), airflow_standalone=1, airflow_port=_free_port(18080, set())
    )
    stack = Stack(settings, service_types=(AirflowService,))
    try:
        assert stack.up() == {"airflow": "started"}
        with httpx.Client(base_url=f"http://127.0.0.1:{settings.airflow_port}", timeout=10) as client:
            yield settings, client
    finally:
        stack.down()


def test_the_dag_list_shows_every_dag_paused_without_a_login(airflow):
    _, client = airflow
    answer = client.get("/api/v2/dags")  # no token: the local Airflow has no login
    assert answer.status_code == 200, answer.text[:500]
    dags = {d["dag_id"]: d for d in answer.json()["dags"]}
    assert set(dags) == DAG_IDS
    assert all(d["is_paused"] for d in dags.values())  # DAGs start paused (dags/README.md)
    assert client.get("/api/v2/importErrors").json()["total_entries"] == 0
    page = client.get("/dags")
    assert page.status_code == 200 and "<html" in page.text.lower()


def test_a_triggered_run_runs_its_job_with_the_projects_settings(airflow):
    """rebuild_views into the live namespace: plan succeeds, build's job refuses (exit 1, a
    verdict: failed at the first try), the switch never runs."""
    _, client = airflow
    assert client.patch("/api/v2/dags/rebuild_views", json={"is_paused": False}).status_code == 200
    answer = client.post(
        "/api/v2/dags/rebuild_views/dagRuns",
        json={"logical_date": None, "conf": {"namespace": "v1", "switch": False}},
    )
    assert answer.status_code == 200, answer.text[:500]
    run_id = answer.json()["dag_run_id"]
    deadline = time.monotonic() + 300
    while (state := client.get(f"/api/v2/dags/rebuild_views/dagRuns/{run_id}").json()["state"]) not in (
        "success",
        "failed",
    ):
        assert time.monotonic() < deadline, f"the run is still {state}"
        time.sleep(2)
    tis = client.get(f"/api/v2/dags/rebuild_views/dagRuns/{run_id}/taskInstances").json()["task_instances"]
    got = {t["task_id"]: (t["state"], t["try_number"]) for t in tis}
    assert state == "failed"
    assert got["plan"] == ("success", 1)
    assert got["build"] == ("failed", 1)  # retries=1, unused: exit 1 is a verdict
    assert got["switch"][0] == "upstream_failed"
    log = client.get(f"/api/v2/dags/rebuild_views/dagRuns/{run_id}/taskInstances/build/logs/1").json()
    text = "\n".join(e.get("event", "") if isinstance(e, dict) else str(e) for e in log["content"])
    assert "'v1' is the live namespace" in text, text[-2000:]
