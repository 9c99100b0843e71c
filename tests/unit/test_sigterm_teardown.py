"""SIGTERM ends a test session as Ctrl-C does: the fixtures' teardown runs (tests/conftest.py), so a
session's Kafka, Redis and speed layers, started in process sessions of their own, are stopped."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from infra.settings import REPO_ROOT

SESSION = """
import time
import pytest

@pytest.fixture(scope="session")
def stack():
    yield
    open({marker!r}, "w").write("torn down")

def test_long(stack):
    open({started!r}, "w").write("running")
    time.sleep(120)
"""


def test_sigterm_tears_the_session_fixtures_down(tmp_path: Path):
    started, marker = tmp_path / "started", tmp_path / "torn-down"
    test_file = tmp_path / "test_session.py"
    test_file.write_text(SESSION.format(marker=str(marker), started=str(started)))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            "-q",
            str(test_file),
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not started.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert marker.read_text() == "torn down", out
    assert "KeyboardInterrupt" in out and "SIGTERM" in out, out
