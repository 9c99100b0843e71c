"""The fast tier keeps its promise (docs/testing.md): nothing in tests/unit can start a JVM or run Go,
for this process and every process a test starts, so a slow test cannot move back unnoticed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("tool", ["java", "go"])
def test_java_and_go_fail_with_one_line_naming_the_integration_tier(tool):
    out = subprocess.run([tool, "version"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 97
    assert out.stderr.count("\n") == 1
    assert "tests/integration/local/" in out.stderr and tool in out.stderr


def test_a_grandchilds_jvm_is_refused_too():
    # a `python -m ...` a test starts, which starts a JVM the way Spark's launcher does
    code = "import os, subprocess; raise SystemExit(subprocess.run([os.environ['JAVA_HOME'] + '/bin/java']).returncode)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=10).returncode == 97


def test_the_jdk_spark_would_be_given_is_the_stand_in():
    from infra.jars import spark_java_home
    from infra.settings import get_settings

    home = spark_java_home(get_settings())
    assert home is not None and str(home) == os.environ["JAVA_HOME"]
    assert (
        subprocess.run([home / "bin" / "java", "-version"], capture_output=True, timeout=10).returncode == 97
    )


def test_make_test_fast_builds_nothing_with_go():
    # the fast tier's make target (and what it depends on) runs no Go: versitygw, the S3 lake tests'
    # server, is built by `make setup` and before the integration tier (`s3-server`), never first
    from infra.settings import REPO_ROOT

    def dry_run(target: str) -> str:
        done = subprocess.run(
            ["make", "-n", "--no-print-directory", target],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "ensure-s3server" not in dry_run("test-fast")
    assert "ensure-s3server" in dry_run("test-integration") and "ensure-s3server" in dry_run("setup")
