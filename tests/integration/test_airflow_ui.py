"""The Airflow UI as a person gets it: `SOCIAL_AIRFLOW_STANDALONE=1 make up` (or `make airflow`).

`airflow standalone` started by the stack's AirflowService on a private port and var dir; then,
through Airflow's own REST API (what the UI's DAG list page reads): every DAG listed, paused at
creation, no login needed; the UI page itself served; a triggered run really runs its task
(scheduler -> executor -> the task's job in a child process) with the project's settings; and a
task that fails has its report link served by the API server and sends its failure notice through
the connection the start-up provisioned.
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


def test_a_failed_task_links_its_report_and_sends_a_notice(airflow):
    """data_quality on a stack with no lake: validate's job fails at once (exit 1). Its "Report"
    link, as the UI reads it, opens the page under var/reports/ that the API server serves (the
    plugin of infra/airflow_plugins/), and the connection `infra.airflow db` provisioned received
    one JSON notice of the failure (var/airflow/failures.jsonl)."""
    import json
    from urllib.parse import urlsplit

    settings, client = airflow
    page = settings.reports_dir / "quality" / "index.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("<html>the Data Docs</html>")
    assert client.patch("/api/v2/dags/data_quality", json={"is_paused": False}).status_code == 200
    answer = client.post("/api/v2/dags/data_quality/dagRuns", json={"logical_date": None, "conf": {}})
    assert answer.status_code == 200, answer.text[:500]
    run_id = answer.json()["dag_run_id"]
    deadline = time.monotonic() + 300
    while (state := client.get(f"/api/v2/dags/data_quality/dagRuns/{run_id}").json()["state"]) not in (
        "success",
        "failed",
    ):
        assert time.monotonic() < deadline, f"the run is still {state}"
        time.sleep(2)
    assert state == "failed"
    links = client.get(f"/api/v2/dags/data_quality/dagRuns/{run_id}/taskInstances/validate/links").json()
    url = links["extra_links"]["Report"]
    assert url == f"http://127.0.0.1:{settings.airflow_port}/reports/quality/index.html"
    assert client.get(urlsplit(url).path).text == "<html>the Data Docs</html>"
    notices = settings.var_dir / "airflow" / "failures.jsonl"
    deadline = time.monotonic() + 30  # the callback runs as the task ends, beside its state change
    while not notices.exists() or run_id not in notices.read_text():
        assert time.monotonic() < deadline, notices.read_text() if notices.exists() else "no notice file"
        time.sleep(1)
    sent = [json.loads(line) for line in notices.read_text().splitlines()]
    assert [(n["task_id"], n["report"]) for n in sent if n["run_id"] == run_id] == [("validate", url)]
