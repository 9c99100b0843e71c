"""`make test`'s integration run on pytest-xdist workers: each worker's stack on ports of its own,
the longest files handed out first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import WORKER_PORT_STRIDE, isolated_settings
from tests.integration.conftest import FILE_SECONDS, FIRST

ROOT = Path(__file__).resolve().parents[2]


def test_the_second_workers_stack_prefers_ports_a_stride_above_the_firsts(monkeypatch, tmp_path):
    import infra.stack

    monkeypatch.setattr(infra.stack, "port_free", lambda port: True)  # as on an idle machine
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    first = isolated_settings(tmp_path / "a")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    second = isolated_settings(tmp_path / "b")
    assert (first.kafka_port, first.kafka_controller_port, first.redis_port, first.api_port) == (
        19092,
        19093,
        16379,
        18000,
    )
    for name in ("kafka_port", "kafka_controller_port", "redis_port", "api_port"):
        assert getattr(second, name) == getattr(first, name) + WORKER_PORT_STRIDE, name
    assert second.kafka_bootstrap == f"127.0.0.1:{first.kafka_port + WORKER_PORT_STRIDE}"


def test_the_files_go_out_longest_first_in_the_order_xdist_keeps():
    names = {p.name for p in (ROOT / "tests" / "integration").glob("test_*.py")}
    assert set(FILE_SECONDS) <= names  # a renamed file would silently lose its place
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "tests/integration",
            "--ignore=tests/integration/local",  # as the Makefile's INTEGRATION runs them
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    files = []
    for line in out.splitlines():
        if "::" in line:
            f = Path(line.split("::")[0]).name
            if not files or files[-1] != f:
                files.append(f)
    assert len(files) == len(set(files))  # every file's tests together, in their own order
    # the files that must start their worker's first Spark session, then longest first
    listed = sorted(FILE_SECONDS, key=lambda f: (f not in FIRST, -FILE_SECONDS[f]))
    assert files[: len(FIRST)] == list(FIRST)
    assert files == listed + sorted(set(files) - set(listed))
    # xdist's default would sort the files by their number of tests again
    integration = next(
        line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("INTEGRATION :=")
    )
    assert "--dist loadfile" in integration and "--no-loadscope-reorder" in integration
    assert "--ignore=tests/integration/local" in integration
