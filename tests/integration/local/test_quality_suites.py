"""The quality suites fail when their data is broken, and pass when it is not.

Small Delta tables are written with the real layout (pipelines.lake.Lake, pipelines.tables
schemas) in a temporary folder; each test breaks one thing on purpose, the way a bug or a dual
write would, and runs the suite that must catch it.
"""

from __future__ import annotations

import json
import shutil
import time

import pytest

from infra.settings import get_settings

pytestmark = pytest.mark.spark

NS = "v1"
T = 1_767_225_600_000  # 2026-01-01T00:00:00Z, like the generator's simulated clock


def _rows(spark, lake, table, rows):
    from pipelines.tables import TABLES

    lake.append(table, spark.createDataFrame(rows, TABLES[table].ddl))


def _bronze(event_id, type_, user_id, offset, disposition="applied", event_time=T, reason=None):
    return (
        event_id,
        type_,
        user_id,
        event_time,
        event_time,
        event_time,
        event_time,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        0,
        offset,
        disposition,
        reason,
        "2026-01-01",
    )


@pytest.fixture(scope="module")
def clean_lake(spark, tmp_path_factory):
    """A consistent namespace: 3 users, 1 follows 2, posts (so timelines), an inbox, one batch row."""
    from pipelines.lake import Lake
    from pipelines.tables import STORED

    var = tmp_path_factory.mktemp("quality-var")
    settings = get_settings(var_dir=var)
    lake = Lake(spark, settings.lake_dir, NS)
    lake.ensure_tables()  # every table, the archive's included, as the archiver creates them
    _rows(spark, lake, "users", [(1, "ann", "Ann", T), (2, "bob", "Bob", T), (3, "cy", "Cy", T)])
    _rows(spark, lake, "follows", [(1, 2, T)])
    _rows(
        spark,
        lake,
        "posts",
        [(2, 100, T, "hi", False, None), (1, 101, T, "me", False, None), (2, 102, T, "x", True, T + 5)],
    )
    # home_timeline is derived from posts and follows (pipelines/derived.py): 1 sees 100 and its
    # own 101, 2 its own 100; 102 is deleted
    _rows(spark, lake, "inbox", [(1, 500, 2, "hey", T, False), (1, 501, 3, "yo", T, True)])
    _rows(spark, lake, "unread_counts", [(1, 1), (3, 0)])
    _rows(spark, lake, "user_status", [(1, "busy", T)])
    _rows(
        spark,
        lake,
        "events_bronze",
        [
            _bronze("e1", "post_created", 2, 0),
            _bronze("e2", "post_created", 1, 1),
            _bronze("e1", "post_created", 2, 2, disposition="duplicate"),
            _bronze("e3", "post_deleted", 3, 3, disposition="rejected", reason="not_author"),
        ],
    )
    _rows(spark, lake, "quarantine", [(0, 4, "3", "{not json", "bad_json", None, None, T)])
    versions = {t: lake.version(t) for t in STORED if t != "batches"}
    batch = (
        0,
        json.dumps({"0": 5}),
        100,
        97,
        2,
        1,
        json.dumps(versions),
        int(time.time() * 1000),
        T,
        T,
        "{}",
        int(time.time() * 1000),
        "{}",
    )
    _rows(spark, lake, "batches", [batch])
    return settings


@pytest.fixture
def lake_copy(clean_lake, tmp_path):
    """A private copy of the clean namespace that a test may break."""
    var = tmp_path / "var"
    shutil.copytree(clean_lake.var_dir / "lake", var / "lake")
    return get_settings(var_dir=var)


def _run(spark, settings, *suites, **kw):
    """Run suites; Data Docs only where a test asks (rendering them is most of a checkpoint's time)."""
    from pipelines import quality

    kw.setdefault("data_docs", False)
    return quality.run(settings, namespace=NS, suites=suites or None, spark=spark, **kw)


def _sql(spark, settings, table, statement, monkeypatch):
    """Break ``table`` with ``statement``; a derived view (``home_timeline``) has no table to break,
    so its derivation is made to return the statement's rows besides its own."""
    from pipelines import derived
    from pipelines.tables import TABLES

    if TABLES[table].stored:
        spark.sql(statement.replace("{t}", f"delta.`{settings.lake_dir / NS / table}`"))
        return
    extra = spark.sql(statement.replace("INSERT INTO {t} VALUES", "VALUES"))
    right = derived.DERIVE[table]
    monkeypatch.setitem(derived.DERIVE, table, lambda *a, **kw: right(*a, **kw).union(extra))


def test_clean_namespace_passes_every_suite_and_writes_data_docs(spark, lake_copy):
    report = _run(spark, lake_copy, log_end={0: 5}, data_docs=True)
    failed = {r.suite: r.failures for r in report.suites if not r.success}
    assert report.ok, failed
    assert len(report.suites) >= 12
    docs = lake_copy.reports_dir / "quality"
    assert (docs / "index.html").exists()
    assert json.loads((docs / "latest.json").read_text())["ok"] is True


# Each break targets one suite; together they prove every suite catches something and no suite
# fails for a table it does not check.
BREAKS = {
    "unread_invariant": ("unread_counts", "UPDATE {t} SET unread = 5 WHERE user_id = 1"),
    "home_timeline_references": ("home_timeline", "INSERT INTO {t} VALUES (2, 101, 1, 1767225600000)"),
    "events_bronze": ("events_bronze", "UPDATE {t} SET disposition = 'applied' WHERE offset = 2"),
    "users": ("users", "INSERT INTO {t} VALUES (NULL, 'x', 'X', 1767225600000)"),
    "follows": ("follows", "INSERT INTO {t} VALUES (1, 2, 1767225600000)"),
    "posts": ("posts", "ALTER TABLE {t} ADD COLUMNS (likes BIGINT)"),
    "quarantine": ("quarantine", "UPDATE {t} SET reason = NULL"),
    "user_status": ("user_status", "UPDATE {t} SET event_time = 1767225600"),  # seconds, not ms
    "log_health": ("batches", "UPDATE {t} SET applied = applied - 1"),  # accounting gap
}


def test_each_break_fails_exactly_its_suite(spark, lake_copy, monkeypatch):
    for table, statement in BREAKS.values():
        _sql(spark, lake_copy, table, statement, monkeypatch)
    report = _run(spark, lake_copy, log_end={0: 5})
    failed = {r.suite for r in report.suites if not r.success}
    assert failed == set(BREAKS)
    assert not report.ok
    for r in report.suites:
        assert bool(r.failures) == (r.suite in BREAKS), r
    # cross-table rules name the offending rows (the checkpoint's unexpected_index_column_names)
    (unread,) = next(r for r in report.suites if r.suite == "unread_invariant").failures
    assert unread["rows"] == [{"user_id": 1, "unread": 5, "inbox_unread": 1}], unread
    timeline = next(r for r in report.suites if r.suite == "home_timeline_references").failures
    assert {"user_id": 2, "post_id": 101, "author_id": 1, "author_followed": False} in [
        row for f in timeline for row in f["rows"]
    ], timeline
    assert report.skipped == {
        name: f"no table {lake_copy.lake_dir / NS / 'analytics' / query} (the stream analytics did not write it)"
        for name, query in ANALYTICS_SUITES.items()
    }


ANALYTICS_SUITES = {
    "analytics_activity_per_minute": "activity_per_minute",
    "analytics_alerts": "alerts",
    "analytics_late_events": "late_events",
    "analytics_message_reads": "message_reads",
    "analytics_sessions": "sessions",
}


def test_analytics_tables_have_suites_that_name_the_broken_rows(spark, lake_copy):
    """The stream-analytics tables (pipelines/analytics/) are checked once the analytics wrote them."""
    from pipelines.analytics.runner import ALERTS_DDL

    base = lake_copy.lake_dir / NS / "analytics"
    window = "timestamp('2026-01-01 00:00:00'), timestamp('2026-01-01 00:00:10')"
    alerts = spark.createDataFrame([], ALERTS_DDL)
    alerts.write.format("delta").save(str(base / "alerts"))
    spark.sql(
        f"INSERT INTO delta.`{base / 'alerts'}` VALUES "
        f"('burst:7:0', 'burst', 7, {window}, 12, 10, array('e1'), 0, 0, 0), "
        f"('burst:7:0', 'burst', 7, {window}, 12, 10, array('e1'), 0, 0, 1), "  # twice: not exactly once
        f"('burst:8:0', 'burst', 8, {window}, 3, 10, array('e2'), 0, 0, 1)"  # under its threshold
    )
    report = _run(spark, lake_copy, "analytics_alerts")
    (result,) = report.suites
    assert not result.success
    failed = {f["expectation"]: f for f in result.failures}
    assert set(failed) == {
        "expect_column_values_to_be_unique",
        "expect_column_pair_values_a_to_be_greater_than_b",
    }
    under = failed["expect_column_pair_values_a_to_be_greater_than_b"]["rows"]
    assert [(row["alert_id"], row["value"], row["threshold"]) for row in under] == [("burst:8:0", 3, 10)]
    assert {row["alert_id"] for row in failed["expect_column_values_to_be_unique"]["rows"]} == {"burst:7:0"}


@pytest.mark.parametrize(
    ("suite", "table", "statement"),
    [
        ("unread_counts", "unread_counts", "UPDATE {t} SET unread = -1 WHERE user_id = 3"),
        ("home_timeline_references", "home_timeline", "INSERT INTO {t} VALUES (2, 102, 2, 1767225600000)"),
        ("events_bronze", "events_bronze", "UPDATE {t} SET event_time = 1767225600 WHERE offset = 1"),
    ],
    ids=["negative-unread", "deleted-post-in-timeline", "time-in-seconds"],
)
def test_broken_table_fails_its_suite(spark, lake_copy, suite, table, statement, monkeypatch):
    _sql(spark, lake_copy, table, statement, monkeypatch)
    report = _run(spark, lake_copy, suite)
    assert not report.ok
    assert report.suites[0].failures


def test_quarantine_rate_over_threshold_fails(spark, lake_copy):
    assert _run(spark, lake_copy, "log_health", log_end={0: 5}).ok  # 1% quarantined
    strict = get_settings(var_dir=lake_copy.var_dir, quality_max_quarantine_pct=0)
    report = _run(spark, strict, "log_health", log_end={0: 5})
    assert [f["column"] for f in report.suites[0].failures] == ["quarantine_pct"]


def test_views_behind_the_log_and_old_are_stale(spark, lake_copy, monkeypatch):
    _sql(
        spark,
        lake_copy,
        "batches",
        f"UPDATE {{t}} SET visible_at = {int(time.time() * 1000) - 3_600_000}",
        monkeypatch,
    )
    assert _run(spark, lake_copy, "log_health", log_end={0: 5}).ok  # caught up: an idle log is not stale
    report = _run(spark, lake_copy, "log_health", log_end={0: 6})  # one event not yet visible after 1 h
    assert [f["column"] for f in report.suites[0].failures] == ["staleness_s"]


def test_in_flight_speed_layer_commits_are_not_read(spark, lake_copy, monkeypatch):
    """A micro-batch newer than the last batches row is invisible: tables are read as of that row."""
    from pipelines.lake import Lake
    from pipelines.quality import snapshot

    lake = Lake(spark, lake_copy.lake_dir, NS)
    spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", json.dumps({"batch_id": 1}))
    try:
        _sql(spark, lake_copy, "unread_counts", "UPDATE {t} SET unread = 7 WHERE user_id = 1", monkeypatch)
    finally:
        spark.conf.unset("spark.databricks.delta.commitInfo.userMetadata")
    snap = snapshot(spark, lake_copy, NS)
    assert snap.versions["unread_counts"] == lake.last_batch().versions["unread_counts"]
    assert _run(spark, lake_copy, "unread_invariant").ok
