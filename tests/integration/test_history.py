"""Finished Spark jobs stay inspectable: event logs under var/spark-events, read by `make history`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from infra.settings import REPO_ROOT, get_settings

pytestmark = [pytest.mark.integration]


def test_a_finished_job_is_listed_by_the_history_server(tmp_path):
    from infra.history import command
    from infra.stack import settings_env
    from tests.conftest import _free_port

    settings = get_settings(var_dir=tmp_path, spark_master="local[1]")
    job = "from infra.settings import get_settings; from pipelines.spark import build_spark; "
    job += "s = build_spark('eventlog-probe', get_settings()); s.range(10).count(); s.stop()"
    done = subprocess.run(
        [sys.executable, "-c", job],
        cwd=REPO_ROOT,
        env=settings_env(settings),
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    events = tmp_path / "spark-events"
    assert any(events.iterdir()), "no event log written"
    port = _free_port(18180, set())
    cmd, env = command(events, port)
    server = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        names: list[str] = []
        while "eventlog-probe" not in names:
            assert time.monotonic() < deadline, f"history server lists {names}"
            assert server.poll() is None, "the history server exited"
            try:
                url = f"http://127.0.0.1:{port}/api/v1/applications"
                with urllib.request.urlopen(url, timeout=3) as answer:
                    names = [app["name"] for app in json.loads(answer.read())]
            except OSError:
                pass
            time.sleep(1)
    finally:
        server.terminate()
        server.wait(timeout=30)
