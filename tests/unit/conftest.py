"""Unit-test fixtures: one small local SparkSession (the test baseline of pipelines.spark), and a
private Airflow (its metadata DB in a temporary AIRFLOW_HOME) for the DAG tests."""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import redis

from infra.airflow import airflow_env
from infra.settings import get_settings

# Airflow reads its configuration once, at its first import in this process: every unit test
# that imports it gets the project's Airflow environment with a private home, never var/airflow.
_AIRFLOW_VAR = Path(tempfile.mkdtemp(prefix="unit-airflow-"))
atexit.register(shutil.rmtree, _AIRFLOW_VAR, ignore_errors=True)
AIRFLOW_SETTINGS = get_settings(var_dir=_AIRFLOW_VAR)
os.environ.update(
    {k: v for k, v in airflow_env(AIRFLOW_SETTINGS, base={}).items() if k.startswith("AIRFLOW")}
)


@pytest.fixture(scope="session")
def airflow_db():
    """The private Airflow's metadata DB, migrated (once per session, ~30 s)."""
    from infra.airflow import ensure_db

    return ensure_db(AIRFLOW_SETTINGS)


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """A fresh session per test module: memory held by one module's jobs cannot starve the next."""
    from infra.settings import get_settings
    from pipelines.spark import build_spark

    settings = get_settings(var_dir=tmp_path_factory.mktemp("spark-var"), spark_master="local[2]")
    session = build_spark("unit-tests", settings, testing=True)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    """A redis-server of this module's own (the keyed state's tests: docs/views.md by hand, the
    property test, the compaction of a changelog the real functions wrote)."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("redis-server not on PATH: run `make setup`")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [
            server,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(d),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail("redis-server did not start")
            time.sleep(0.05)
    yield url
    proc.terminate()
    proc.wait(10)
