"""The batch layer (Lambda) on small hand-worked logs, and against the keyed speed layer.

The cases are the speed layer's (tests/unit/test_speed_processor.py), worked out by hand from
docs/views.md; the records go through the real parse into an in-memory archive. The last tests
run a generated log through both implementations (the keyed processor into a real redis-server,
the batch layer in Spark) and compare every view with the cross-check ``verify`` uses.
"""

from __future__ import annotations

import json

import pytest
import redis

from pipelines.speed import functions
from pipelines.speed.processor import Processor, ProcessorConfig
from tests.unit.events import T0, ev
from tests.unit.test_speed_processor import PARTITIONS, redis_url, to_records  # noqa: F401

pytestmark = pytest.mark.spark


def archive(spark, events):
    """(bronze, quarantine, position) of a log, as the archiver lays it out."""
    from pipelines.parse import parse_records

    recs = to_records(events)
    df = spark.createDataFrame(
        [(None, raw, p, o, None) for p, o, raw in recs],
        "key binary, value binary, partition int, offset long, timestamp timestamp",
    )
    bronze, quarantine = parse_records(df)
    position = {p: sum(1 for q, _o, _v in recs if q == p) for p in range(PARTITIONS)}
    return bronze, quarantine, position, recs


def batch(spark, events, **cfg):
    from pipelines.batch_layer.definition import BatchConfig, compute

    bronze, quarantine, position, _ = archive(spark, events)
    return compute(bronze, quarantine, position, BatchConfig(**cfg))


def timelines(views):
    out: dict[int, list[int]] = {}
    rows = views.home_timeline.orderBy("user_id", F_desc("event_time"), F_desc("post_id")).collect()
    for r in rows:
        out.setdefault(r["user_id"], []).append(r["post_id"])
    return out


def F_desc(c):  # noqa: N802
    from pyspark.sql import functions as F

    return F.col(c).desc()


def reasons(views):
    return sorted(r["reason"] for r in views.dispositions.where("reason IS NOT NULL").collect())


def test_follow_unfollow_refollow(spark):
    v = batch(
        spark,
        [
            ev("followed", 1, 0, followee_id=2),
            ev("followed", 1, 1, followee_id=3),
            ev("unfollowed", 1, 2, followee_id=2),
            ev("unfollowed", 1, 3, followee_id=3),
            ev("followed", 1, 4, followee_id=2),
            ev("unfollowed", 1, 5, followee_id=9),  # not following: no effect, not an error
        ],
    )
    assert [tuple(r) for r in v.follows.collect()] == [(1, 2, T0 + 4000)]
    assert reasons(v) == []


def test_post_then_delete_and_delete_by_someone_else(spark):
    v = batch(
        spark,
        [
            ev("followed", 1, 0, followee_id=2),
            ev("post_created", 2, 1, post_id=20, text="a"),
            ev("post_created", 2, 2, post_id=21, text="b"),
            ev("post_deleted", 3, 3, post_id=21),  # not the author: rejected
            ev("post_deleted", 2, 4, post_id=20),
            ev("post_deleted", 2, 5, post_id=20),  # already deleted: rejected
            ev("post_deleted", 2, 6, post_id=77),  # never existed: rejected
        ],
    )
    assert timelines(v) == {1: [21], 2: [21]}
    assert sorted(tuple(r) for r in v.posts.collect()) == [
        (2, 20, T0 + 1000, "a", True, T0 + 4000),
        (2, 21, T0 + 2000, "b", False, None),
    ]
    assert reasons(v) == ["not_own_post", "not_own_post", "post_already_deleted"]


def test_message_read_before_and_after_arrival(spark):
    v = batch(
        spark,
        [
            ev("message_read", 5, 0, message_id=50),  # before it arrives: rejected
            ev("message_sent", 4, 1, message_id=50, recipient_id=5, text="hi"),
            ev("message_sent", 4, 2, message_id=51, recipient_id=5, text="again"),
            ev("message_read", 6, 3, message_id=51),  # not the recipient: rejected
            ev("message_read", 5, 4, message_id=50),
            ev("message_read", 5, 5, message_id=50),  # re-read: applied, no change
            ev("message_sent", 4, 6, message_id=52, recipient_id=5, text="3rd"),
            ev("message_sent", 7, 7, message_id=52, recipient_id=5, text="same id"),  # reused
        ],
    )
    assert sorted(tuple(r) for r in v.inbox.collect()) == [
        (5, 50, 4, "hi", T0 + 1000, True),
        (5, 51, 4, "again", T0 + 2000, False),
        (5, 52, 4, "3rd", T0 + 6000, False),
    ]
    assert [tuple(r) for r in v.unread_counts.collect()] == [(5, 2)]
    assert reasons(v) == ["not_in_inbox", "not_in_inbox", "reused_id"]


def test_duplicates_within_window_only(spark):
    post = ev("post_created", 1, 0, eid="same", post_id=10, text="x")
    late = dict(post, received_time=post["received_time"] + 2 * 3600 * 1000)
    v = batch(spark, [post, post, late], dedup_window_ms=3600 * 1000)
    # the second copy is within the window; the third comes 2 h after the last sighting: not a
    # duplicate, and as a reused post_id it is rejected by the posts rules
    got = [(r["offset"], r["disposition"], r["reason"]) for r in v.dispositions.orderBy("offset").collect()]
    assert got == [(0, "applied", None), (1, "duplicate", None), (2, "rejected", "reused_id")]
    acct = {r["partition"]: tuple(r)[1:] for r in v.accounting.collect()}
    assert acct == {0: (0, 0, 0, 0, 0, 0, 0), 1: (3, 3, 1, 1, 1, 0, 0)}


def test_a_duplicate_counts_from_its_last_sighting(spark):
    # copies 1 h apart with a 90 min window: each is within the window of the one before it
    base = ev("status_updated", 1, 0, eid="e", text="s")
    copies = [dict(base, received_time=base["received_time"] + h * 3600 * 1000) for h in range(3)]
    v = batch(spark, copies, dedup_window_ms=90 * 60 * 1000)
    assert [r["disposition"] for r in v.dispositions.orderBy("offset").collect()] == [
        "applied",
        "duplicate",
        "duplicate",
    ]


def test_offline_events_ordered_by_corrected_time(spark):
    skewed = ev("post_created", 2, 50, post_id=30, text="old, device clock 1 h behind")
    skewed["device_time"] -= 3600_000
    skewed["sent_time"] -= 3600_000  # the clock offset is corrected away: event time = t=50 s
    offline = ev("post_created", 2, 10, post_id=31, text="written offline at t=10 s, sent late")
    offline["sent_time"] += 100_000
    offline["received_time"] += 100_000
    v = batch(
        spark,
        [
            ev("followed", 1, 0, followee_id=2),
            skewed,
            offline,
            ev("post_created", 2, 20, post_id=32, text="t=20 s"),
        ],
    )
    assert timelines(v)[1] == [30, 32, 31]


def test_celebrity_crossing_the_threshold_both_ways(spark):
    follows = [ev("followed", u, 0, followee_id=100) for u in range(1, 5)]  # 4 followers of 100
    follows += [ev("followed", 1, 0, followee_id=200)]
    posts = [
        ev("post_created", 100, 1, post_id=1000, text="celebrity"),
        ev("post_created", 200, 2, post_id=2000, text="normal"),
    ]
    v = batch(spark, follows + posts, fanout_threshold=3)
    assert [tuple(r) for r in v.celebrities.collect()] == [(100, 4)]
    assert timelines(v) == {1: [2000], 100: [1000], 200: [2000]}
    # 100 drops to 3 followers = the threshold: no longer a celebrity, fanned out to 1, 2, 3
    v = batch(spark, follows + posts + [ev("unfollowed", 4, 3, followee_id=100)], fanout_threshold=3)
    assert v.celebrities.count() == 0
    assert timelines(v) == {1: [2000, 1000], 2: [1000], 3: [1000], 100: [1000], 200: [2000]}


def test_crossing_upwards_leaves_the_next_posts_in_a_short_timeline(spark):
    evs = [
        ev("followed", 1, 0, followee_id=100),
        ev("followed", 1, 0, followee_id=200),
        ev("post_created", 200, 1, post_id=2001, text="old normal"),
        ev("post_created", 200, 2, post_id=2002, text="normal"),
        ev("post_created", 100, 3, post_id=1003, text="c1"),
        ev("post_created", 100, 4, post_id=1004, text="c2"),
    ]
    assert timelines(batch(spark, evs, fanout_threshold=2, timeline_length=2))[1] == [1004, 1003]
    more = [ev("followed", 3, 5, followee_id=100), ev("followed", 5, 5, followee_id=100)]
    assert timelines(batch(spark, evs + more, fanout_threshold=2, timeline_length=2))[1] == [2002, 2001]


def test_timeline_keeps_latest_n_after_a_delete(spark):
    posts = [ev("post_created", 2, i, post_id=100 + i, text=str(i)) for i in range(5)]
    v = batch(
        spark,
        [ev("followed", 1, 0, followee_id=2), *posts, ev("post_deleted", 2, 9, post_id=104)],
        timeline_length=3,
    )
    assert timelines(v) == {1: [103, 102, 101], 2: [103, 102, 101]}


def test_invalid_records_are_quarantined_and_accounted(spark):
    bad = [(1, b"{"), (1, json.dumps(ev("followed", 1, 0, followee_id=1)).encode()), (1, b"\xff\xfe")]
    v = batch(spark, [ev("followed", 1, 0, followee_id=2), *bad, ev("status_updated", 1, 1, text="hi")])
    got = [(r["offset"], r["disposition"], r["reason"]) for r in v.dispositions.orderBy("offset").collect()]
    assert got == [
        (0, "applied", None),
        (1, "quarantined", "bad_json"),
        (2, "quarantined", "self_follow"),
        (3, "quarantined", "not_utf8"),
        (4, "applied", None),
    ]
    assert [tuple(r) for r in v.user_status.collect()] == [(1, "hi", T0 + 1000)]


def test_archive_gap_is_reported_missing(spark):
    from pipelines.batch_layer.definition import BatchConfig, compute

    bronze, quarantine, position, _ = archive(spark, [ev("followed", 1, 0, followee_id=2)])
    v = compute(bronze, quarantine, {0: 0, 1: 3}, BatchConfig())  # P says 3 records, archive has 1
    assert [(r["partition"], r["records"], r["missing"]) for r in v.accounting.collect()] == [
        (0, 0, 0),
        (1, 1, 2),
    ]


# ---------------------------------------------------------------------------------------------
# Both implementations on generated logs: batch layer == keyed speed layer, every view.
# ---------------------------------------------------------------------------------------------
def keyed(url, ns, recs, **cfg):
    proc = Processor(ProcessorConfig(redis_url=url, namespace=ns, record_freshness=False, **cfg))
    for p in range(PARTITIONS):
        proc.process(p, [(o, v) for q, o, v in recs if q == p])
    return redis.Redis.from_url(url)


@pytest.mark.parametrize("seed,n,threshold", [(11, 20, 8), (5, 800, 2000)])
def test_generated_log_batch_layer_equals_speed_layer(spark, redis_url, seed, n, threshold):  # noqa: F811
    from app_sim.generator import GeneratorConfig, generate
    from pipelines.batch_layer.cross_check import changelog_dispositions, cross_check
    from pipelines.batch_layer.definition import BatchConfig, compute

    cfg = GeneratorConfig(users=40, seed=seed, mean_followers=6, invalid_share=0.02, duplicate_share=0.03)
    evs = [(k, v) for k, v, _inj in generate(3000, cfg)]
    bronze, quarantine, position, recs = archive(spark, evs)
    ns = f"bl{seed}"
    r = keyed(redis_url, ns, recs, timeline_length=n, fanout_threshold=threshold)
    views = compute(bronze, quarantine, position, BatchConfig(timeline_length=n, fanout_threshold=threshold))
    live_disp = spark.createDataFrame(
        changelog_dispositions(r, ns, list(range(PARTITIONS))),
        "partition INT, offset BIGINT, disposition STRING, reason STRING",
    )
    got = cross_check(spark, r, ns, views, position, n, live_dispositions=live_disp)
    failed = {k: v["examples"] for k, v in got["views"].items() if not v["ok"]}
    assert got["ok"], failed
    # the log exercises what it should: duplicates, rejections, quarantine, full timelines
    acct = {
        k: sum(r_[k] for r_ in views.accounting.collect()) for k in ("duplicates", "rejected", "quarantined")
    }
    assert all(acct.values()), acct
    assert got["views"]["home_timeline"]["batch_rows"] > 100
    assert got["views"]["dispositions"]["batch_rows"] == 3000

    # ... and the check can fail: one follow lost in Redis is named with its key and both values
    u = int(r.scan_iter(match=f"{ns}:following:*").__next__().decode().rsplit(":", 1)[1])
    followee = int(next(iter(r.smembers(functions.key(ns, "following", u)))))
    r.srem(functions.key(ns, "following", u), followee)
    got = cross_check(spark, r, ns, views, position, n)
    bad = got["views"]["follows"]
    assert got["ok"] is False and bad["mismatches"] == 1
    assert bad["examples"] == [
        {"view": "follows", "key": {"user_id": u, "followee_id": followee}, "live": None, "batch": True}
    ]
