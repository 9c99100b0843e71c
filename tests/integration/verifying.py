"""How the integration tests call ``verify`` and what they require of its report.

Both run ``python -m pipelines.verify`` as a separate process, as the ``verify_views`` DAG runs it:

- :func:`run_verify` + :func:`assert_verified`: the whole check (the Delta views and archive
  against the batch layer's recomputation, Redis against Delta, the keyed state against a replay
  of the log, the accounting, the changelog once);
- :func:`verify_keyed` + :func:`assert_keyed_ok`: ``--keyed-only``, the keyed state in Redis
  against the same processor replayed over the log into a scratch namespace, key by key, and the
  accounting (no Delta, so a test whose point is the live state runs no archiver).
"""

from __future__ import annotations

import json
import subprocess
import sys

from pipelines.tables import VIEWS


def _verify(settings, topic: str, namespace: str, *args: str, report: str) -> tuple[dict, int, str]:
    """``python -m pipelines.verify`` with ``args``: its report (``report`` under the reports
    dir), its exit code and the tail of its output."""
    from infra.stack import settings_env

    done = subprocess.run(
        [sys.executable, "-m", "pipelines.verify", *args, "--topic", topic, "--namespace", namespace],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=900,
    )
    got = json.loads((settings.reports_dir / "verify" / report).read_text())
    assert got["namespace"] == namespace
    return got, done.returncode, done.stdout[-3000:] + done.stderr[-3000:]


def run_verify(settings, topic: str, namespace: str) -> dict:
    report, code, out = _verify(settings, topic, namespace, report="latest.json")
    return {**report, "_exit_code": code, "_stdout": out}


def assert_verified(report: dict, summary) -> None:
    assert report["_exit_code"] == 0, report["_stdout"]
    assert report["ok"], {k: v["mismatches"] for k, v in report["views"].items()}
    for name in (*VIEWS, "events_bronze", "quarantine"):
        view = report["views"][name]
        assert view["mismatches"] == 0 and view["live_rows"] == view["recomputed_rows"], (name, view)
    a = report["accounting"]
    assert a["events_read"] == summary.events == a["records_below_position"]
    assert a["events_read"] == a["applied"] + a["duplicates"] + a["quarantined"]
    # what the generator injected is what the speed layer accounted for
    assert a["duplicates"] == summary.duplicates
    assert a["quarantined"] == sum(summary.invalid.values())
    assert report["serving"]["ok"] is True, report["serving"]
    # the Delta changelog: each record below P archived once, none twice (exactly-once appends)
    assert report["changelog"]["duplicates"] == 0 and report["changelog"]["ok"], report["changelog"]
    # the keyed state in Redis == the same processor replayed into a scratch namespace, key by key
    k = report["keyed"]
    assert k["ok"] is True, {n: f for n, f in k.get("families", {}).items() if not f["ok"]} or k
    assert k["accounting"]["events_read"] == summary.events
    assert k["accounting"]["duplicates"] == summary.duplicates
    assert k["accounting"]["rejected"] + k["accounting"]["quarantined"] == a["quarantined"]


def verify_keyed(settings, topic: str, namespace: str) -> dict:
    report, code, out = _verify(settings, topic, namespace, "--keyed-only", report="keyed.json")
    return {**report["keyed"], "_exit": code, "_out": out}


def assert_keyed_ok(k: dict, summary) -> None:
    assert k["_exit"] == 0, k["_out"]
    assert k["ok"] is True, {n: f for n, f in k["families"].items() if not f["ok"]}
    a = k["accounting"]
    assert a["events_read"] == summary.events
    assert a["events_read"] == a["applied"] + a["duplicates"] + a["rejected"] + a["quarantined"]
    assert a["duplicates"] == summary.duplicates
    assert a["rejected"] + a["quarantined"] == sum(summary.invalid.values())
    # one changelog entry per record, by construction of its ids; none twice
    assert k["families"]["changelog"]["keys"] > 0
