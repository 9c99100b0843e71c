"""``make demo`` as users run it, in CI: the same command (``python -m stories.demo``, what the
Makefile's ``demo`` target runs) on a stack of its own (free ports, a var dir of its own), at a
smaller size through its documented knobs (``DEMO_EVENTS``, ``DEMO_USERS``,
``DEMO_LIVE_SECONDS``), with the analytics and the alert injection on.

It must exit 0 with the verify ok, no mismatch in any comparison, the quality checks ok, the
injected patterns fired, and every line of the summary printed. A demo that fails fails
``make test``, hence ``.ci/run``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.settings import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The demo's own ceiling. Measured on this 2-core machine while other runs kept its load at 4-12
# (2026-11-28): 437 s (the test 442 s), an earlier run 502 s; of it the stack's start ~110 s, one
# archive and one compaction ~85 s, verify ~130-150 s and quality ~95-130 s through Airflow, the
# analytics page ~40 s. In CI beside the unit run and another integration file it ran past 600 s
# (2026-11-28: archive 123 s, verify 153 s, quality 138 s, then cut while it waited for the
# alerts): the ceiling leaves that pace room for the alerts' own 300 s wait.
DEMO_TIMEOUT_S = 1080
# A small world: 50 users (each follows up to all the others: ~2,400 follows), 6,000 events of
# history over ~100 minutes of event time at the demo's pace, then 15 s live.
DEMO_ENV = {"DEMO_EVENTS": "6000", "DEMO_USERS": "50", "DEMO_LIVE_SECONDS": "15"}
# The archiver as the other integration tests run it (tests/integration/conftest.py): a ~20 s
# stream gets no archive of its own, then one archive and one compaction at once when the speed
# layer is idle at the log's end (each costs ~10-30 CPU-seconds however few records it holds);
# and one API worker (the demo only asks it for its health).
ARCHIVER = {
    "archive_interval_s": 60.0,
    "archive_durability_s": 1.0,
    "compaction_interval_s": 300.0,
    "compacted_partitions": 1,
    "api_workers": 1,
}


@pytest.mark.timeout(DEMO_TIMEOUT_S + 120)
def test_make_demo_passes_with_a_true_summary(tmp_path: Path, private_settings):
    from infra.stack import Stack, settings_env
    from stories.demo import SUMMARY

    settings = private_settings(tmp_path / "var", analytics=1, **ARCHIVER)
    env = {**settings_env(settings), **DEMO_ENV}
    log = tmp_path / "demo.log"
    started = time.monotonic()
    try:
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "stories.demo"],
                cwd=REPO_ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # on a timeout, its whole process group is ours to stop
            )
            rc = None
            try:
                rc = proc.wait(timeout=DEMO_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
            finally:  # timed out, or the session interrupted: the demo's process group stops too
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=60)
    finally:
        Stack(settings).down()
    text = log.read_text()
    tail = "\n".join(line for line in text.replace("\r", "\n").splitlines() if line.strip())[-6000:]
    took = time.monotonic() - started
    assert rc is not None, f"the demo did not finish within {DEMO_TIMEOUT_S}s:\n{tail}"
    assert rc == 0, f"the demo exited {rc} after {took:.0f}s:\n{tail}"

    summary = text.split("==> summary", 1)[-1]
    for line in SUMMARY:
        assert f"  {line} " in summary, f"summary line {line!r} missing:\n{tail}"
    result = json.loads((tmp_path / "var" / "reports" / "demo" / "summary.json").read_text())
    assert result["verify_ok"] and result["quality_ok"], tail
    assert all(n == 0 for n in result["mismatches"].values()), result["mismatches"]
    # the speed layer counted exactly the re-sends the demo injected (history and live part): no
    # other event was taken for a duplicate (the live part's writer counts its own event ids)
    assert result["duplicates_as_injected"] is True, summary
    # the archive's lag is reported: the Delta views reached the log's end after the serving path
    # did (never before: they are compacted from what Redis applied), in seconds, within the run
    assert 0 <= result["serving_caught_up_s"] <= result["archive_caught_up_s"] < took, result
    assert "archive lag" in summary and "the Delta views covered the log" in summary
    # the serving path's freshness was measured on the live events, not left out
    assert result["freshness"]["events"] > 0 and result["freshness"]["p99_ms"] is not None
    # every injected pattern fired
    assert set(result["alerts"]["injected"]) == {"burst", "follow_churn", "message_flood"}, result["alerts"]
    verify = json.loads((tmp_path / "var" / "reports" / "verify" / "latest.json").read_text())
    assert verify["ok"], {k: v for k, v in verify.items() if k in ("keyed", "batch_layer", "serving")}
    # and it says where its time went
    assert verify["phases"] and sum(verify["phases"].values()) <= verify["seconds"] + 1, verify["phases"]
