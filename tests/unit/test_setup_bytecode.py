"""`make setup` compiles the dependencies and the project to bytecode once (Makefile, $(STAMP) and
setup): with PYTHONDONTWRITEBYTECODE set, as in this machine's environment, nothing else ever
writes it, and every process would compile every module it imports again (`import airflow.sdk`
3.2 s instead of 1.4 s)."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest

# a dependency every Spark job imports, one every Airflow process imports, and the project's own
MODULES = ["pyspark.sql.session", "airflow.sdk", "redis.client", "pipelines.verify", "infra.settings"]


@pytest.mark.parametrize("name", MODULES)
def test_setup_left_the_bytecode_of_what_every_process_imports(name):
    source = Path(importlib.import_module(name).__file__)
    cached = Path(importlib.util.cache_from_source(str(source)))
    assert cached.exists(), (
        f"{cached} missing: `make setup` compiles it (uv sync --compile-bytecode, compileall)"
    )
