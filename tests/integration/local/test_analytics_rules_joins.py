"""The joins and the alert rules on small event sets; expected rows worked out by hand.

Rules (thresholds small for the test): burst = more than 3 posts in a 10 s window sliding by
5 s; follow churn = at least 2 follows undone within 60 s in a 10-minute window; message flood
= at least 3 distinct recipients in a 60 s window. An alert fires once per (rule, user, window),
in the micro-batch whose events cross the threshold.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.analytics.config import AnalyticsConfig
from pipelines.analytics.joins import time_to_read_per_hour
from tests.integration.local.analytics_harness import T0_MS, Log, at, ev

pytestmark = pytest.mark.spark
HOUR = 3600
RULES_CFG = AnalyticsConfig(
    lateness_s=60,
    burst_posts=3,
    burst_window_s=10,
    churn_within_s=60,
    churn_repeats=2,
    churn_window_s=600,
    flood_recipients=3,
    flood_window_s=60,
)


@pytest.fixture(scope="module")
def alerts(spark, tmp_path_factory):
    log = Log(tmp_path_factory.mktemp("rules"), cfg=RULES_CFG)
    u1_posts = [ev("post_created", 1, t) for t in (1, 2, 3, 4, 4.5)]
    u3_posts = [ev("post_created", 3, t) for t in (8, 9, 11, 12)]
    f7, u7 = ev("followed", 1, 10, followee_id=7), ev("unfollowed", 1, 40, followee_id=7)
    f9, u9 = ev("followed", 1, 180, followee_id=9), ev("unfollowed", 1, 200, followee_id=9)
    flood = [ev("message_sent", 1, t, recipient_id=r) for t, r in ((5, 2), (10, 3), (20, 4))]
    log.batch(
        *u1_posts[:3],
        *[ev("post_created", 2, t) for t in (4, 6, 8)],  # 3 posts: not more than 3
        *u3_posts[:2],
        f7,
        u7,
        ev("followed", 1, 60, followee_id=8),
        ev("unfollowed", 1, 150, followee_id=8),  # 90 s later: not a churn
        ev("followed", 2, 0, followee_id=7),
        ev("unfollowed", 2, 30, followee_id=7),  # one churn only
        ev("followed", 4, 570, followee_id=5),
        ev("unfollowed", 4, 590, followee_id=5),
        ev("followed", 4, 610, followee_id=5),
        ev("unfollowed", 4, 620, followee_id=5),  # two churns, but in two windows
        *[ev("message_sent", 2, t, recipient_id=r) for t, r in ((1, 3), (2, 3), (3, 3), (4, 4))],
        ev("message_sent", 5, 50, recipient_id=1),
        ev("message_sent", 5, 55, recipient_id=2),
        ev("message_sent", 5, 70, recipient_id=3),  # 3 recipients, but over two windows
        *flood[:2],
    )
    log.batch(u1_posts[3], *u3_posts[2:], f9, u9, flood[2])  # the crossing events
    log.batch(u1_posts[4])  # a fifth post in windows that already fired: no new alert
    log.run(spark, ["burst", "follow_churn", "message_flood"])
    ids = {
        "u1": [e["event_id"] for e in u1_posts],
        "u3": [e["event_id"] for e in u3_posts],
        "churn": [e["event_id"] for e in (f7, u7, f9, u9)],
        "flood": [e["event_id"] for e in flood],
    }
    return {r["alert_id"]: r for r in log.table(spark, "alerts").collect()}, ids


def test_alerts_fire_once_per_rule_user_window(alerts):
    got, _ = alerts
    summary = sorted(
        (
            r["rule"],
            r["user_id"],
            r["window_start"],
            r["window_end"],
            r["value"],
            r["threshold"],
            r["batch_id"],
        )
        for r in got.values()
    )
    assert summary == [
        ("burst", 1, at(-5), at(5), 4, 3, 1),  # posts at 1, 2, 3 (batch 0) and 4 (batch 1)
        ("burst", 1, at(0), at(10), 4, 3, 1),  # the same four in the overlapping window
        ("burst", 3, at(5), at(15), 4, 3, 1),  # 8, 9, 11, 12: across the 10 s boundary
        ("follow_churn", 1, at(0), at(600), 2, 2, 1),  # followee 7 (30 s), 9 (20 s); 8 took 90 s
        ("message_flood", 1, at(0), at(60), 3, 3, 1),
    ]
    assert set(got) == {
        f"burst:1:{T0_MS - 5000}",
        f"burst:1:{T0_MS}",
        f"burst:3:{T0_MS + 5000}",
        f"follow_churn:1:{T0_MS}",
        f"message_flood:1:{T0_MS}",
    }


def test_alerts_carry_the_events_that_fired_them(alerts):
    got, ids = alerts
    assert sorted(got[f"burst:1:{T0_MS}"]["event_ids"]) == sorted(ids["u1"][:4])
    assert sorted(got[f"burst:3:{T0_MS + 5000}"]["event_ids"]) == sorted(ids["u3"])
    assert sorted(got[f"follow_churn:1:{T0_MS}"]["event_ids"]) == sorted(ids["churn"])
    assert sorted(got[f"message_flood:1:{T0_MS}"]["event_ids"]) == sorted(ids["flood"])
    assert all(r["last_received_time"] >= T0_MS and r["raised_at"] > 0 for r in got.values())


def test_message_reads_within_24h_and_unread(spark, tmp_path):
    log = Log(tmp_path)
    sent = [
        ev("message_sent", 1, 0, message_id=1, recipient_id=2),
        ev("message_sent", 1, 60, message_id=2, recipient_id=3),
        ev("message_sent", 2, 120, message_id=3, recipient_id=1),
        ev("message_sent", 1, 180, message_id=4, recipient_id=2),
    ]
    read = ev("message_read", 2, 45, message_id=1)  # 45 s after it was sent
    log.batch(
        *sent,
        read,
        ev("message_read", 3, 240, message_id=4),  # not the recipient (2): no match
        sent[0],  # a retry of the first message (the same event): still one message, one read
    )
    log.batch(read)  # and of its read, a batch later
    log.batch(ev("message_read", 1, 120 + 25 * HOUR, message_id=3))  # read 25 h later: too late
    log.batch(ev("post_created", 9, 26 * HOUR + 200))  # W = 26 h + 140 s: every 24 h bound passed
    log.run(spark, ["message_reads"])
    reads = log.table(spark, "message_reads")
    got = sorted(
        (r["message_id"], r["sender_id"], r["time_to_read_ms"], r["read_within_24h"]) for r in reads.collect()
    )
    assert got == [(1, 1, 45_000, True), (2, 1, None, False), (3, 2, None, False), (4, 1, None, False)]
    hour = time_to_read_per_hour(reads).collect()
    assert len(hour) == 1
    h = hour[0]
    assert (h["hour"], h["messages"], h["read"], h["unread_after_24h"]) == (at(0), 4, 1, 3)
    assert (h["le_10s"], h["le_60s"], h["le_86400s"], h["median_time_to_read_ms"]) == (0, 1, 1, 45_000)


def test_posts_enriched_with_the_current_profile(spark, tmp_path):
    views = tmp_path / "views"
    spark.createDataFrame([(1, "alice"), (2, "bob")], "user_id BIGINT, handle STRING").write.format(
        "delta"
    ).save(str(views / "users"))
    status = str(views / "user_status")
    spark.createDataFrame([(1, "coding")], "user_id BIGINT, text STRING").write.format("delta").save(status)
    log = Log(tmp_path)
    p1, p2, p3 = (ev("post_created", u, 10 * u, post_id=100 + u) for u in (1, 2, 3))
    log.batch(p1, p2, p3, ev("status_updated", 2, 5))
    log.run(spark, ["posts_enriched"], views_root=views)
    # bob's status reaches the views between two micro-batches: his next post carries it
    spark.createDataFrame([(1, "coding"), (2, "sleeping")], "user_id BIGINT, text STRING").write.format(
        "delta"
    ).mode("overwrite").save(status)
    log.batch(ev("post_created", 2, 40, post_id=204))
    log.run(spark, ["posts_enriched"], views_root=views)
    got = sorted(
        (r["post_id"], r["author_id"], r["handle"], r["author_status"], r["views_version"])
        for r in log.table(spark, "posts_enriched").collect()
    )
    assert got == [
        (101, 1, "alice", "coding", 0),
        (102, 2, "bob", None, 0),  # no status in the views yet
        (103, 3, None, None, 0),  # not in the views: kept, with nulls
        (204, 2, "bob", "sleeping", 0),
    ]


def test_alert_dedup_reads_only_the_batchs_windows(spark, tmp_path):
    """The anti-join against the alerts raised before is keyed by window: its read must not grow
    with every alert ever raised. Five windows' alerts, one file each; a batch of the third window
    reads one file and finds that window's alert."""
    from pyspark.sql import functions as F

    from pipelines.analytics.runner import AlertSink, Paths

    sink = AlertSink(Paths(lake=tmp_path, checkpoints=tmp_path / "cp"), "test", kafka=None)
    ddl = "alert_id STRING, window_start TIMESTAMP"
    for w in range(5):
        rows = [(f"burst:{u}:{w}", at(10 * w)) for u in (1, 2)]
        spark.createDataFrame(rows, ddl).coalesce(1).write.format("delta").mode("append").save(
            sink.paths.table("alerts")
        )
    batch = spark.createDataFrame([("burst:1:2", at(20)), ("burst:3:2", at(20))], ddl)
    raised = sink.raised(batch)
    assert len(raised.inputFiles()) == 1
    assert sorted(r["alert_id"] for r in raised.collect()) == ["burst:1:2", "burst:2:2"]
    assert sink.raised(batch.where(F.lit(False))) is None


# The last line of a checkpoint's offsets file: Kafka offsets per topic and partition (what the
# outputs recorded when each read the log), or the Delta source's offset (the events table).
KAFKA_OFFSETS = '{"social.events":{"0":304,"1":344}}'
DELTA_OFFSETS = '{"sourceVersion":1,"reservoirId":"3152f668","reservoirVersion":4,"index":-1}'


def test_an_earlier_designs_checkpoint_stops_the_analytics_with_the_fix(tmp_path, private_settings):
    from pipelines.analytics import runner

    settings = private_settings(tmp_path)
    paths = runner.Paths.for_namespace(settings, "v1")
    for name, last in (("burst", KAFKA_OFFSETS), ("sessions", DELTA_OFFSETS)):
        offsets = Path(paths.checkpoint(name)) / "offsets"
        offsets.mkdir(parents=True)
        (offsets / "0").write_text('v1\n{"batchWatermarkMs":0}\n' + last)
        (offsets / "1").write_text('v1\n{"batchWatermarkMs":0}\n' + last)
    assert runner.read_the_log_directly(paths, ("burst", "sessions", "message_flood")) == ["burst"]
    with pytest.raises(SystemExit, match=r"\['burst'\].*earlier design.*remove"):
        runner.run(settings, namespace="v1", names=("burst", "sessions"))
