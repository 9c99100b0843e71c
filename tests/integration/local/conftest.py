"""The integration tier's tests that need no broker but a JVM or Go (docs/testing.md): a local
Spark session (the test baseline of pipelines.spark), the Spark class archive, JVM flags, the
compose-go checker. `make test` runs them in one process beside the xdist integration run, so one
JVM serves them all (a session per module, stopped after it)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """A fresh session per test module: memory held by one module's jobs cannot starve the next."""
    from infra.settings import get_settings
    from pipelines.spark import build_spark

    settings = get_settings(var_dir=tmp_path_factory.mktemp("spark-var"), spark_master="local[2]")
    session = build_spark("unit-tests", settings, testing=True)
    yield session
    session.stop()
