"""The fast tier's fixtures (docs/testing.md): a private redis-server per module (the views' Lua runs
in a real Redis, which starts in milliseconds) and a private Airflow (its metadata DB in a temporary
AIRFLOW_HOME) for the DAG tests.

No test here starts a JVM or needs Go: `java` and `go` resolve to a stand-in that fails with one line
saying where such a test belongs (tests/integration/local/), for this process and every process a
test starts, so a slow test cannot creep back into the fast tier unnoticed.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from infra.airflow import airflow_env
from infra.settings import get_settings

_NO_JVM = Path(tempfile.mkdtemp(prefix="fast-tier-no-jvm-"))
atexit.register(shutil.rmtree, _NO_JVM, ignore_errors=True)
(_NO_JVM / "bin").mkdir()
for _tool in ("java", "go"):
    _stub = _NO_JVM / "bin" / _tool
    _stub.write_text(
        "#!/bin/sh\n"
        f'echo \'tests/unit is the fast tier: it starts no JVM and needs no Go ({_tool} "$*");'
        " a test that does belongs in tests/integration/local/ (docs/testing.md)' >&2\n"
        "exit 97\n"
    )
    _stub.chmod(0o755)
os.environ["PATH"] = f"{_NO_JVM / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
os.environ["JAVA_HOME"] = str(_NO_JVM)
os.environ["SOCIAL_SPARK_JAVA_HOME"] = str(_NO_JVM)  # what Spark's launcher would be given

# Airflow reads its configuration once, at its first import in this process: every unit test
# that imports it gets the project's Airflow environment with a private home, never var/airflow.
_AIRFLOW_VAR = Path(tempfile.mkdtemp(prefix="unit-airflow-"))
atexit.register(shutil.rmtree, _AIRFLOW_VAR, ignore_errors=True)
AIRFLOW_SETTINGS = get_settings(var_dir=_AIRFLOW_VAR)
os.environ.update(
    {k: v for k, v in airflow_env(AIRFLOW_SETTINGS, base={}).items() if k.startswith("AIRFLOW")}
)
# One Fernet key for this process and the `airflow db migrate` child: Airflow generates one into
# airflow.cfg when it writes the file, and a process that imported Airflow before the file existed
# (a DAG-bag test ahead of the first migration) has none, so it could not read the failure notices'
# connection the migration's provisioning stored encrypted.
os.environ.setdefault("AIRFLOW__CORE__FERNET_KEY", Fernet.generate_key().decode())


@pytest.fixture(scope="session")
def airflow_db():
    """The private Airflow's metadata DB, migrated (once per session, ~30 s)."""
    from infra.airflow import ensure_db

    return ensure_db(AIRFLOW_SETTINGS)
