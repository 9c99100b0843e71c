"""The API's own metrics (app_sim/api/metrics.py) without a stack: route templates as labels, a
500 counted, appends by outcome, and the multiprocess mode summing every worker's values."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import generate_latest

from app_sim.api import metrics as api_metrics
from infra.settings import REPO_ROOT


def _app(metrics: api_metrics.ApiMetrics) -> FastAPI:
    app = FastAPI()
    app.add_middleware(api_metrics.MetricsMiddleware, metrics=metrics)

    @app.get("/v1/users/{user_id}/status")
    async def status(user_id: int):
        return {"user_id": user_id}

    @app.get("/boom")
    async def boom():
        raise RuntimeError("boom")

    return app


def _requests(method: str, route: str, status: int, n: int) -> str:
    return f'social_api_requests_total{{method="{method}",route="{route}",status="{status}"}} {n}.0'


def test_requests_are_labelled_by_route_template_and_a_crash_counts_as_500():
    metrics = api_metrics.ApiMetrics()

    async def calls() -> list[int]:
        transport = httpx.ASGITransport(_app(metrics), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
            return [
                (await c.get("/v1/users/7/status")).status_code,
                (await c.get("/v1/users/8/status")).status_code,
                (await c.get("/v1/users/x/status")).status_code,
                (await c.get("/nowhere/12345")).status_code,
                (await c.post("/v1/users/7/status")).status_code,
                (await c.get("/boom")).status_code,
            ]

    assert asyncio.run(calls()) == [200, 200, 422, 404, 405, 500]
    text = generate_latest(metrics.registry).decode()
    assert _requests("GET", "/v1/users/{user_id}/status", 200, 2) in text
    assert _requests("GET", "/v1/users/{user_id}/status", 422, 1) in text
    assert _requests("GET", "unmatched", 404, 1) in text
    assert _requests("POST", "/v1/users/{user_id}/status", 405, 1) in text
    assert _requests("GET", "/boom", 500, 1) in text
    assert 'social_api_request_seconds_count{method="GET",route="/v1/users/{user_id}/status"} 3.0' in text
    assert "12345" not in text and 'route="/v1/users/7' not in text


class _Log:
    def __init__(self, fail: bool):
        self.fail, self.closed = fail, False

    async def append(self, event):
        if self.fail:
            raise RuntimeError("no ack")
        return (0, 1)

    def close(self):
        self.closed = True


def test_appends_are_counted_by_outcome_and_everything_else_passes_through():
    metrics = api_metrics.ApiMetrics()
    ok, down = api_metrics.CountedLog(_Log(False), metrics), api_metrics.CountedLog(_Log(True), metrics)
    assert asyncio.run(ok.append({"type": "post_created"})) == (0, 1)
    with pytest.raises(RuntimeError):
        asyncio.run(down.append({"type": "followed"}))
    ok.close()
    assert ok.closed
    text = generate_latest(metrics.registry).decode()
    assert 'social_api_appends_total{outcome="acknowledged",type="post_created"} 1.0' in text
    assert 'social_api_appends_total{outcome="failed",type="followed"} 1.0' in text


WORKER = """
from app_sim.api import metrics as api_metrics
m = api_metrics.ApiMetrics()
assert api_metrics.multiprocess()
for _ in range({n}):
    m.observe("/v1/unread", "GET", 200, 0.004)
m.appends.labels("acknowledged", "post_created").inc()
print(m.exposition().decode())
"""


def test_one_scrape_sums_every_worker_process(tmp_path):
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    # two worker processes (each its own pid's files); the second one's scrape sums both
    for n in (2, 3):
        done = subprocess.run(
            [sys.executable, "-c", WORKER.format(n=n)],
            env=env,
            cwd=REPO_ROOT,
            check=True,
            capture_output=True,
        )
    out = done.stdout.decode()
    assert 'social_api_requests_total{method="GET",route="/v1/unread",status="200"} 5.0' in out
    assert 'social_api_request_seconds_bucket{le="0.005",method="GET",route="/v1/unread"} 5.0' in out
    assert 'social_api_appends_total{outcome="acknowledged",type="post_created"} 2.0' in out


def test_the_parent_empties_the_directory_of_an_earlier_run(tmp_path, monkeypatch):
    from dataclasses import replace

    from infra.settings import get_settings

    settings = replace(get_settings(), var_dir=tmp_path, api_port=18123)
    old = api_metrics.multiproc_dir(settings)
    old.mkdir(parents=True)
    (old / "counter_1.db").write_bytes(b"stale")
    monkeypatch.delenv(api_metrics.ENV, raising=False)
    path = api_metrics.prepare_multiproc_dir(settings)
    assert path == tmp_path / "run" / "api-18123-metrics" and list(path.iterdir()) == []
    assert os.environ[api_metrics.ENV] == str(path)
