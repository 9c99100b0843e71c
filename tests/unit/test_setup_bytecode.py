"""Every process a make target starts caches the bytecode it compiles (Makefile: `unexport
PYTHONDONTWRITEBYTECODE`): with PYTHONDONTWRITEBYTECODE set, as in this machine's environment,
every process compiled every module it imported again (`import airflow.sdk` 3.2 s instead of
1.4 s), and the suite starts hundreds."""

from __future__ import annotations

import os
import subprocess
import sys

from infra.settings import REPO_ROOT

# a dependency every Spark job imports, one every Airflow process imports, and the project's own
MODULES = ["pyspark.sql.session", "airflow.sdk", "redis.client", "pipelines.verify", "infra.settings"]

PROBE = f"""
import importlib, importlib.util, sys
from pathlib import Path
missing = []
for name in {MODULES!r}:
    source = importlib.import_module(name).__file__
    if not Path(importlib.util.cache_from_source(source)).exists():
        missing.append(name)
print(sys.flags.dont_write_bytecode, sys.dont_write_bytecode, missing)
"""


def test_a_make_target_caches_what_its_processes_compile_whatever_the_callers_environment(tmp_path):
    # a throwaway target evaluated inside the project's Makefile, the caller's environment set
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    target = f"bytecode-probe: ; @{sys.executable} {probe}"
    done = subprocess.run(
        ["make", "-s", "--no-print-directory", "--eval", target, "bytecode-probe"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # not told to skip writing, and after importing them every module's bytecode is on disk
    assert done.stdout.strip() == "0 False []", done.stdout + done.stderr
