"""How the integration tests run verify (and their other one-off Spark jobs), and what they
require of its report.

Both run the same functions ``python -m pipelines.verify`` runs, in this pytest worker's process,
with its one Spark session (:func:`worker_spark`):

- :func:`run_verify` + :func:`assert_verified`: the whole check (the Delta views and archive
  against the batch layer's recomputation, Redis against Delta, the keyed state against a replay
  of the log, the accounting, the changelog once);
- :func:`verify_keyed` + :func:`assert_keyed_ok`: ``--keyed-only``, the keyed state in Redis
  against the same processor replayed over the log into a scratch namespace, key by key, and the
  accounting (no Delta, so a test whose point is the live state runs no archiver).

The command itself (its arguments, its exit code, its process) is what the DAG tests run
(test_dags_e2e.py: ``verify_views`` runs ``python -m pipelines.verify`` as a task of its own).
"""

from __future__ import annotations

import dataclasses

from pipelines.tables import VIEWS

# The worker's session lives for the whole run and runs a dozen jobs, so its JVM keeps C2 (with
# the serial collector), as the unit run's does; the services and the one-off commands the tests
# start get C1 only (the Makefile's SHORT_JVM). A private stack of 12,000 events, one process
# (2026-11-28): a whole verify 106-110 CPU-s as a command of its own; in a warm session 55 (C1)
# or 41-45 (C2); a keyed verify 20 as a command, 2-3 warm.
WORKER_JAVA_OPTIONS = "-XX:+UseSerialGC"


def worker_spark(settings):
    """This pytest worker's Spark session: started by the first test that needs one (with its
    settings' directories: Spark's scratch space and event log), the same one after that. Every
    job the tests run in-process takes its stores from the settings it is given, never from the
    session, so one session serves every test's private stack."""
    from pipelines.spark import build_spark

    return build_spark(
        "integration-worker",
        dataclasses.replace(settings, spark_driver_java_options=WORKER_JAVA_OPTIONS),
    )


def run_verify(settings, topic: str, namespace: str) -> dict:
    """``python -m pipelines.verify --topic T --namespace NS``: the report it writes
    (``var/reports/verify/latest.json``)."""
    from pipelines.verify import verify

    return verify(worker_spark(settings), settings, namespace=namespace, topic=topic)


def assert_verified(report: dict, summary) -> None:
    assert report["ok"], {
        "views": {k: v["mismatches"] for k, v in report["views"].items()},
        **{k: v for k, v in report.items() if isinstance(v, dict) and v.get("ok") is False},
    }
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
    """``python -m pipelines.verify --keyed-only``: the ``keyed`` part of the report it writes
    (``var/reports/verify/keyed.json``)."""
    from pipelines.verify import verify_keyed_only

    return verify_keyed_only(worker_spark(settings), settings, namespace, topic)["keyed"]


def assert_keyed_ok(k: dict, summary) -> None:
    assert k["ok"] is True, {n: f for n, f in k["families"].items() if not f["ok"]}
    a = k["accounting"]
    assert a["events_read"] == summary.events
    assert a["events_read"] == a["applied"] + a["duplicates"] + a["rejected"] + a["quarantined"]
    assert a["duplicates"] == summary.duplicates
    assert a["rejected"] + a["quarantined"] == sum(summary.invalid.values())
    # one changelog entry per record, by construction of its ids; none twice
    assert k["families"]["changelog"]["keys"] > 0
