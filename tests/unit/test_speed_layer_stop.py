"""The speed-layer harness stops a driver as ``make down`` does: SIGTERM to the driver alone.

The driver here is a stand-in process group (no Spark): a leader that exits on SIGTERM, and a
child in its group (where the JVM sits) that records any SIGTERM it gets and otherwise lives on.
The child must never see the SIGTERM (a JVM killed under a driver's Py4J call made stops hang for
a minute), and whatever of the group outlives the timeout is killed, so nothing is left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from infra.settings import get_settings
from pipelines.speed_layer_process import SpeedLayerProcess

CHILD = """
import signal, sys, time
from pathlib import Path
mark = Path(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: mark.write_text("child got SIGTERM"))
Path(sys.argv[2]).write_text("ready")
while True:
    time.sleep(0.05)
"""

LEADER = """
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]])
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
while not stopping:
    time.sleep(0.05)
"""


def _group(tmp_path: Path, name: str) -> tuple[subprocess.Popen, Path, Path]:
    mark, ready = tmp_path / f"{name}.sigterm", tmp_path / f"{name}.ready"
    proc = subprocess.Popen(
        [sys.executable, "-c", LEADER, CHILD, str(mark), str(ready)], start_new_session=True
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError("the stand-in child did not start")
        time.sleep(0.05)
    return proc, mark, ready


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs (by ps, not by the harness's own reading)."""
    ps = subprocess.run(["ps", "-o", "stat=", "--sid", str(pgid)], capture_output=True, text=True)
    return any(not state.startswith("Z") for state in ps.stdout.split())


def test_stop_signals_the_drivers_only_and_leaves_no_process_of_their_groups(tmp_path):
    sl = SpeedLayerProcess(get_settings(var_dir=tmp_path), "t", "ns", tmp_path / "sl.log")
    sl.proc, speed_mark, _ = _group(tmp_path, "speed")
    sl.archiver, archiver_mark, _ = _group(tmp_path, "archiver")
    started = time.monotonic()
    try:
        sl.stop(timeout_s=3.0)
    finally:
        took = time.monotonic() - started
        for proc in (sl.proc, sl.archiver):  # whatever stop() did, nothing of them outlives the test
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    assert sl.proc.returncode == 0 and sl.archiver.returncode == 0  # the drivers exited on SIGTERM
    assert not speed_mark.exists() and not archiver_mark.exists()  # their children got no SIGTERM
    # the children outlived their drivers, so both groups were killed at the one shared deadline
    assert not _group_alive(sl.proc.pid) and not _group_alive(sl.archiver.pid)
    assert 3.0 <= took < 10.0, took
