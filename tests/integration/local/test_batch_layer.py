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

from contract import functions
from pipelines.speed.processor import Processor, ProcessorConfig
from tests.unit.events import T0, ev
from tests.unit.test_speed_processor import PARTITIONS, to_records

pytestmark = pytest.mark.spark


BRONZE = (
    "event_id STRING, type STRING, user_id BIGINT, received_time BIGINT, event_time BIGINT, handle STRING, "
    "display_name STRING, text STRING, followee_id BIGINT, post_id BIGINT, message_id BIGINT, "
    "recipient_id BIGINT, partition INT, offset BIGINT"
)
FIELDS = [c.split()[0] for c in BRONZE.split(", ")]


def archive(spark, events):
    """(bronze, quarantine, position, records) of a log, as the archiver lays it out.

    The records are checked with the event contract in Python (the same validator the speed layer
    uses): the batch layer's input is the archive, not the raw log.
    """
    import contract

    recs = to_records(events)
    bronze, quarantine = [], []
    for p, o, raw in recs:
        e, reason = contract.parse_and_validate(raw)
        if reason is not None:
            quarantine.append((p, o, None, None, reason))
            continue
        e = dict(e, partition=p, offset=o, event_time=e["device_time"] + e["received_time"] - e["sent_time"])
        bronze.append(tuple(e.get(f) for f in FIELDS))
    position = {p: sum(1 for q, _o, _v in recs if q == p) for p in range(PARTITIONS)}
    return (
        spark.createDataFrame(bronze, BRONZE),
        spark.createDataFrame(
            quarantine, "partition INT, offset BIGINT, event_id STRING, type STRING, reason STRING"
        ),
        position,
        recs,
    )


def batch(spark, events, **cfg):
    from pipelines.batch_layer.definition import BatchConfig, compute
    from pipelines.batch_layer.job import computed_once

    bronze, quarantine, position, _ = archive(spark, events)
    # the shared intermediates computed once, as the job does: each view's collect would compute
    # them again otherwise (a log of these tests: 14.8 -> 6.8 CPU-seconds)
    return compute(bronze, quarantine, position, BatchConfig(**cfg), keep=computed_once)


def collect(views) -> dict[str, list[dict]]:
    return {name: [r.asDict() for r in df.collect()] for name, df in views.tables().items()}


def timelines(tables) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for r in sorted(tables["home_timeline"], key=lambda r: (r["user_id"], -r["event_time"], -r["post_id"])):
        out.setdefault(r["user_id"], []).append(r["post_id"])
    return out


def of(tables, table, **match) -> list[dict]:
    return [r for r in tables[table] if all(r[k] == v for k, v in match.items())]


# One log holds the cases that share a configuration (users apart), computed once per module: a
# Spark job per case would cost minutes on two cores.
H = 3600 * 1000


def _default_cases():
    skewed = ev("post_created", 52, 50, post_id=530, text="old, device clock 1 h behind")
    skewed["device_time"] -= H
    skewed["sent_time"] -= H  # the clock offset is corrected away: event time = t=50 s
    offline = ev("post_created", 52, 10, post_id=531, text="written offline at t=10 s, sent late")
    offline["sent_time"] += 100_000
    offline["received_time"] += 100_000
    post = ev("post_created", 41, 0, eid="same", post_id=410, text="x")
    status = ev("status_updated", 42, 0, eid="e", text="s")
    return [
        # follow, unfollow, re-follow
        ev("followed", 11, 0, followee_id=12),
        ev("followed", 11, 1, followee_id=13),
        ev("unfollowed", 11, 2, followee_id=12),
        ev("unfollowed", 11, 3, followee_id=13),
        ev("followed", 11, 4, followee_id=12),
        ev("unfollowed", 11, 5, followee_id=19),  # not following: no effect, not an error
        # post then delete; delete by someone else
        ev("followed", 21, 0, followee_id=22),
        ev("post_created", 22, 1, post_id=220, text="a"),
        ev("post_created", 22, 2, post_id=221, text="b"),
        ev("post_deleted", 23, 3, post_id=221),  # not the author: not_own_post
        ev("post_deleted", 22, 4, post_id=220),
        ev("post_deleted", 22, 5, post_id=220),  # post_already_deleted
        ev("post_deleted", 22, 6, post_id=277),  # never existed: not_own_post
        # messages read before and after arrival
        ev("message_read", 35, 0, message_id=350),  # before it arrives: not_in_inbox
        ev("message_sent", 34, 1, message_id=350, recipient_id=35, text="hi"),
        ev("message_sent", 34, 2, message_id=351, recipient_id=35, text="again"),
        ev("message_read", 36, 3, message_id=351),  # not the recipient: not_in_inbox
        ev("message_read", 35, 4, message_id=350),
        ev("message_read", 35, 5, message_id=350),  # re-read: applied, no change
        ev("message_sent", 34, 6, message_id=352, recipient_id=35, text="3rd"),
        ev("message_sent", 37, 7, message_id=352, recipient_id=35, text="same id"),  # reused_id
        # duplicates (window 90 min): copies of a post at 0 and 2 h, of a status 1 h apart
        post,
        post,
        dict(post, received_time=post["received_time"] + 2 * H),
        status,
        dict(status, received_time=status["received_time"] + H),
        dict(status, received_time=status["received_time"] + 2 * H),
        # late and offline events are ordered by corrected event time
        ev("followed", 51, 0, followee_id=52),
        skewed,
        offline,
        ev("post_created", 52, 20, post_id=532, text="t=20 s"),
        # invalid records (keyed by user 61)
        (61, b"{"),
        (61, json.dumps(ev("followed", 61, 0, followee_id=61)).encode()),
        (61, b"\xff\xfe"),
        ev("followed", 61, 0, followee_id=62),
        ev("status_updated", 61, 1, text="hi"),
    ]


@pytest.fixture(scope="module")
def default_log(spark):
    return collect(batch(spark, _default_cases(), dedup_window_ms=90 * 60 * 1000))


def test_follow_unfollow_refollow(default_log):
    assert of(default_log, "follows", user_id=11) == [
        {"user_id": 11, "followee_id": 12, "since_time": T0 + 4000}
    ]


def test_post_then_delete_and_delete_by_someone_else(default_log):
    assert {u: t for u, t in timelines(default_log).items() if u in (21, 22, 23)} == {21: [221], 22: [221]}
    assert sorted(tuple(r.values()) for r in of(default_log, "posts", author_id=22)) == [
        (22, 220, T0 + 1000, "a", True, T0 + 4000),
        (22, 221, T0 + 2000, "b", False, None),
    ]


def test_message_read_before_and_after_arrival(default_log):
    assert sorted(tuple(r.values()) for r in default_log["inbox"]) == [
        (35, 350, 34, "hi", T0 + 1000, True),
        (35, 351, 34, "again", T0 + 2000, False),
        (35, 352, 34, "3rd", T0 + 6000, False),
    ]
    assert default_log["unread_counts"] == [{"user_id": 35, "unread": 2}]


def test_rejections_and_quarantine_with_their_reasons(default_log):
    got = sorted((r["disposition"], r["reason"]) for r in default_log["dispositions"] if r["reason"])
    assert got == [
        ("quarantined", "bad_json"),
        ("quarantined", "not_utf8"),
        ("quarantined", "self_follow"),
        ("rejected", "not_in_inbox"),
        ("rejected", "not_in_inbox"),
        ("rejected", "not_own_post"),
        ("rejected", "not_own_post"),
        ("rejected", "post_already_deleted"),
        ("rejected", "reused_id"),  # the message id used twice
        ("rejected", "reused_id"),  # the post copy 2 h later: no duplicate, a reused post_id
    ]


def test_duplicates_within_window_of_the_last_sighting(default_log):
    def seq(eid):
        return [
            (r["disposition"], r["reason"])
            for r in sorted(of(default_log, "dispositions", event_id=eid), key=lambda r: r["offset"])
        ]

    # the post's third copy comes 2 h after the last sighting: not a duplicate, rejected instead
    assert seq("same") == [("applied", None), ("duplicate", None), ("rejected", "reused_id")]
    # each status copy is 1 h after the one before: within the window of its last sighting
    assert seq("e") == [("applied", None), ("duplicate", None), ("duplicate", None)]
    assert of(default_log, "user_status", user_id=42) == [{"user_id": 42, "text": "s", "event_time": T0}]


def test_offline_events_ordered_by_corrected_time(default_log):
    assert timelines(default_log)[51] == [530, 532, 531]


def test_accounting_read_equals_applied_duplicates_rejected_quarantined(default_log):
    totals = {k: sum(r[k] for r in default_log["accounting"]) for k in default_log["accounting"][0]}
    # 6 follow + 7 post + 8 message + 6 duplicate-case + 4 offline + 5 invalid-case records
    assert {
        k: totals[k] for k in ("records", "applied", "duplicates", "rejected", "quarantined", "missing")
    } == {
        "records": 36,
        "applied": 23,
        "duplicates": 3,
        "rejected": 7,
        "quarantined": 3,
        "missing": 0,
    }
    assert of(default_log, "user_status", user_id=61) == [
        {"user_id": 61, "text": "hi", "event_time": T0 + 1000}
    ]


# The fan-out cases (threshold 3, N = 3), before and after the followers that cross it.
def _fanout_before():
    return [
        *[ev("followed", u, 0, followee_id=100) for u in range(101, 105)],  # 4 followers of 100
        ev("followed", 101, 0, followee_id=200),
        ev("post_created", 100, 1, post_id=1000, text="celebrity"),
        ev("post_created", 200, 2, post_id=2000, text="normal"),
        ev("followed", 301, 0, followee_id=300),
        ev("followed", 301, 0, followee_id=400),
        *[ev("post_created", 400, i, post_id=4000 + i, text="older") for i in (1, 2, 3)],
        *[ev("post_created", 300, i, post_id=3000 + i, text="newer") for i in (4, 5, 6)],
        ev("followed", 501, 0, followee_id=502),
        *[ev("post_created", 502, i, post_id=5100 + i, text=str(i)) for i in range(5)],
        ev("post_deleted", 502, 9, post_id=5104),
    ]


def _fanout_after():
    return [
        ev("unfollowed", 104, 3, followee_id=100),  # 100 down to 3 = the threshold: fanned out again
        *[ev("followed", u, 7, followee_id=300) for u in (302, 303, 305)],  # 300 up to 4: a celebrity
    ]


@pytest.fixture(scope="module")
def fanout_logs(spark):
    cfg = {"fanout_threshold": 3, "timeline_length": 3}
    before = _fanout_before()
    return collect(batch(spark, before, **cfg)), collect(batch(spark, before + _fanout_after(), **cfg))


def test_celebrity_crossing_the_threshold_both_ways(fanout_logs):
    before, after = fanout_logs
    assert before["celebrities"] == [{"author_id": 100, "followers": 4}]
    assert {u: t for u, t in timelines(before).items() if u < 300} == {101: [2000], 100: [1000], 200: [2000]}
    assert after["celebrities"] == [{"author_id": 300, "followers": 4}]
    assert {u: t for u, t in timelines(after).items() if u < 300} == {
        101: [2000, 1000],
        102: [1000],
        103: [1000],
        100: [1000],
        200: [2000],
    }


def test_crossing_upwards_leaves_the_next_posts_in_a_full_timeline(fanout_logs):
    before, after = fanout_logs
    assert timelines(before)[301] == [3006, 3005, 3004]
    assert timelines(after)[301] == [4003, 4002, 4001]
    assert all(u not in timelines(after) for u in (302, 303, 305))  # they follow a celebrity only
    assert timelines(after)[300] == [3006, 3005, 3004]  # a celebrity's own timeline keeps its posts


def test_timeline_keeps_latest_n_after_a_delete(fanout_logs):
    before, _ = fanout_logs
    assert timelines(before)[501] == timelines(before)[502] == [5103, 5102, 5101]


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
def keyed(url, ns, recs, layout="keyed", **cfg):
    config = ProcessorConfig(redis_url=url, namespace=ns, record_freshness=False, layout=layout, **cfg)
    if layout == "partitioned":  # every source's deliveries applied: the state at the log's end
        from pipelines.speed.partitioned import PartitionedProcessor

        proc = PartitionedProcessor(config, PARTITIONS)
    else:
        proc = Processor(config)
    for p in range(PARTITIONS):
        proc.process(p, [(o, v) for q, o, v in recs if q == p])
    if layout == "partitioned":
        proc.settle()
    return redis.Redis.from_url(url)


@pytest.mark.parametrize("layout", ["keyed", "partitioned"])
def test_generated_log_batch_layer_equals_speed_layer(spark, redis_url, layout):  # noqa: F811
    seed, n, threshold = 11, 20, 8
    from app_sim.generator import GeneratorConfig, generate
    from pipelines.batch_layer.cross_check import changelog_dispositions, cross_check
    from pipelines.batch_layer.definition import BatchConfig, compute
    from pipelines.batch_layer.job import computed_once

    cfg = GeneratorConfig(
        users=40, seed=seed, mean_followers=6, invalid_share=0.02, duplicate_share=0.03, erasure_share=0.003
    )
    evs = [(k, v) for k, v, _inj in generate(3000, cfg)]
    bronze, quarantine, position, recs = archive(spark, evs)
    ns = f"bl{seed}{layout}"
    functions.drop_namespace(redis.Redis.from_url(redis_url), ns)
    r = keyed(redis_url, ns, recs, layout, timeline_length=n, fanout_threshold=threshold)
    batch_cfg = BatchConfig(timeline_length=n, fanout_threshold=threshold)
    views = compute(bronze, quarantine, position, batch_cfg, keep=computed_once)
    live_disp = spark.createDataFrame(
        changelog_dispositions(r, ns, list(range(PARTITIONS)), layout),
        "partition INT, offset BIGINT, disposition STRING, reason STRING",
    )
    check = dict(layout=layout, fanout_threshold=threshold)
    got = cross_check(spark, r, ns, views, position, n, live_dispositions=live_disp, **check)
    failed = {k: v["examples"] for k, v in got["views"].items() if not v["ok"]}
    assert got["ok"], failed
    # the log exercises what it should: duplicates, rejections, quarantine, full timelines
    acct = {
        k: sum(r_[k] for r_ in views.accounting.collect()) for k in ("duplicates", "rejected", "quarantined")
    }
    assert all(acct.values()), acct
    # ... erasures, and events after them (the reasons are in the dispositions compared above)
    assert sum(1 for _k, v in evs if isinstance(v, dict) and v["type"] == "user_erased") >= 3
    assert (
        sum(
            1 for d in changelog_dispositions(r, ns, list(range(PARTITIONS)), layout) if d[3] == "user_erased"
        )
        > 10
    )
    assert got["views"]["home_timeline"]["batch_rows"] > 100
    assert got["views"]["celebrities"]["batch_rows"] > 0
    assert got["views"]["dispositions"]["batch_rows"] == 3000

    # ... and the check can fail: one follow lost in Redis is named with its key and both values
    following = f"{ns}:following:*" if layout == "keyed" else f"{ns}:{{*}}:following:*"
    key = next(r.scan_iter(match=following)).decode()
    u = int(key.rsplit(":", 1)[1])
    followee = int(next(iter(r.smembers(key))))
    r.srem(key, followee)
    got = cross_check(spark, r, ns, views, position, n, **check)
    bad = got["views"]["follows"]
    assert got["ok"] is False and bad["mismatches"] == 1
    assert bad["examples"] == [
        {"view": "follows", "key": {"user_id": u, "followee_id": followee}, "live": None, "batch": True}
    ]


def test_job_writes_every_view_with_the_position_in_its_commits(spark, tmp_path):
    from infra.settings import get_settings
    from pipelines.batch_layer.job import Archive, batch_position, parse_position, run

    bronze, quarantine, _position, _ = archive(
        spark, [ev("followed", 1, 0, followee_id=2), ev("post_created", 2, 1, post_id=7, text="p"), (1, b"{")]
    )
    root = tmp_path / "lake" / "arch"
    meta = json.dumps({"end_offsets": {"0": 1, "1": 2}})  # as the archiver records it
    bronze.withColumn("disposition", F_lit_null()).write.format("delta").option("userMetadata", meta).save(
        str(root / "events_bronze")
    )
    quarantine.write.format("delta").option("userMetadata", meta).save(str(root / "quarantine"))
    settings = get_settings(var_dir=tmp_path)
    assert Archive(spark, root).position() == {0: 1, 1: 2}
    with pytest.raises(SystemExit, match="beyond what the archive covers"):
        run(spark, settings, namespace="arch", upto={0: 1, 1: 5})
    got = run(spark, settings, namespace="arch", upto=parse_position('{"0": 1, "1": 1}'))
    assert got["out_namespace"] == "arch-batch" and got["ok"]
    # P = {0: 1, 1: 1}: the follow (partition 1, offset 0) and the post (partition 0, offset 0)
    assert got["accounting"] == {
        "records": 2,
        "applied": 2,
        "duplicates": 0,
        "rejected": 0,
        "quarantined": 0,
        "missing": 0,
    }
    assert batch_position(tmp_path / "lake", "arch-batch") == {0: 1, 1: 1}
    assert got["tables"]["home_timeline"]["files"] >= 1 and got["tables"]["celebrities"]["files"] == 0
    timeline = spark.read.format("delta").load(str(tmp_path / "lake" / "arch-batch" / "home_timeline"))
    assert sorted((r["user_id"], r["post_id"]) for r in timeline.collect()) == [(1, 7), (2, 7)]
    with pytest.raises(SystemExit, match="--upto"):
        parse_position("{not json")


def test_quality_suites_check_the_batch_views_alike(spark, tmp_path):
    """The data-quality suites run on the batch layer's namespace as on the speed layer's (the same
    suites and frames); a batch view broken by hand fails exactly the suite that checks it."""
    from infra.settings import get_settings
    from pipelines import quality
    from pipelines.batch_layer.job import run

    log = [
        ev("user_registered", 1, 0, handle="ann", display_name="Ann"),
        ev("user_registered", 2, 0, handle="bob", display_name="Bob"),
        ev("followed", 1, 1, followee_id=2),
        ev("post_created", 2, 2, post_id=7, text="hi"),
        ev("message_sent", 2, 3, message_id=9, recipient_id=1, text="yo"),
        ev("status_updated", 1, 4, text="busy"),
    ]
    bronze, quarantine, position, _ = archive(spark, log)
    root = tmp_path / "lake" / "arch"
    meta = json.dumps({"end_offsets": {str(p): o for p, o in position.items()}})
    bronze.withColumn("disposition", F_lit_null()).write.format("delta").option("userMetadata", meta).save(
        str(root / "events_bronze")
    )
    quarantine.write.format("delta").option("userMetadata", meta).save(str(root / "quarantine"))
    settings = get_settings(var_dir=tmp_path)
    assert run(spark, settings, namespace="arch")["ok"]
    # the view suites and the cross-table frames (this hand-made archive has the batch layer's
    # input columns only, not the whole bronze schema its own suite checks)
    suites = ["users", "follows", "posts", "home_timeline", "home_timeline_references", "inbox"]
    suites += ["unread_counts", "unread_invariant", "user_status", "log_health"]
    got = quality.run(
        settings, namespace="arch-batch", suites=suites, spark=spark, data_docs=False, log_end=position
    )
    assert got.ok, quality.summary(got)
    assert {r.suite for r in got.suites} == set(suites)
    rows = {r.suite: r.rows for r in got.suites}
    # 2 users, 1 edge, 1 post in both home timelines (bob's own, ann follows bob), 1 inbox row
    assert (rows["users"], rows["follows"], rows["posts"], rows["home_timeline"], rows["inbox"]) == (
        2,
        1,
        1,
        2,
        1,
    )

    counts = tmp_path / "lake" / "arch-batch" / "unread_counts"
    spark.sql(f"UPDATE delta.`{counts}` SET unread = unread + 1 WHERE user_id = 1")
    broken = quality.run(
        settings, namespace="arch-batch", suites=suites, spark=spark, data_docs=False, log_end=position
    )
    assert [r.suite for r in broken.suites if not r.success] == ["unread_invariant"]


def F_lit_null():  # noqa: N802
    from pyspark.sql import functions as F

    return F.lit(None).cast("string")


# ---------------------------------------------------------------------------------------------
# Erasure (docs/views.md, "Erasure"): the speed layer's hand-worked logs, users apart.
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def erasure_log(spark):
    from tests.unit.test_speed_processor import erasure_cases_log

    return collect(batch(spark, erasure_cases_log(), fanout_threshold=2, timeline_length=2))


def test_erasure_of_an_author_and_a_celebrity(erasure_log):
    tl = timelines(erasure_log)
    assert {u: tl.get(u, []) for u in (1, 2, 3, 10, 20, 30)} == {
        1: [302, 301],  # refilled from 30's older posts
        2: [],
        3: [],
        10: [],
        20: [],
        30: [302, 301],
    }
    follows = sorted((r["user_id"], r["followee_id"]) for r in erasure_log["follows"] if r["user_id"] < 100)
    assert follows == [(1, 30)]  # 2's follow of the erased 20, after the erasure: no edge
    assert [r["author_id"] for r in erasure_log["posts"] if r["author_id"] < 100] == [30, 30]
    assert of(erasure_log, "users", user_id=10) == [] and of(erasure_log, "user_status", user_id=10) == []
    assert erasure_log["celebrities"] == []


def test_erasure_of_a_user_with_messages_both_ways(erasure_log):
    inbox = sorted(tuple(r.values()) for r in erasure_log["inbox"] if 100 < r["recipient_id"] < 200)
    assert inbox == [
        (102, 600, 0, None, T0 + 3000, True),
        (102, 602, 0, None, T0 + 5000, True),
        (103, 601, 0, None, T0 + 4000, False),
        (103, 700, 102, "kept", T0 + 7000, False),
    ]
    unread = {r["user_id"]: r["unread"] for r in erasure_log["unread_counts"] if 100 < r["user_id"] < 200}
    assert unread == {102: 0, 103: 2}


def test_erase_then_register_the_same_handle_again(erasure_log):
    assert [(r["user_id"], r["handle"], r["display_name"]) for r in erasure_log["users"]] == [
        (209, "alice", "Alice again")
    ]


def test_erasure_before_earlier_events_of_another_partition(erasure_log):
    assert of(erasure_log, "inbox", recipient_id=302) == [
        {"recipient_id": 302, "message_id": 800, "sender_id": 0, "text": None, "event_time": T0 + 2000,
         "read": False}
    ]  # fmt: skip
    assert of(erasure_log, "follows", user_id=302) == []
    assert timelines(erasure_log)[302] == [21]


def test_erasure_rejections(erasure_log):
    rejected = sorted(
        (r["partition"], r["type"]) for r in erasure_log["dispositions"] if r["reason"] == "user_erased"
    )
    # 10: a post and a second erasure; 101: a message to them and a read; 207: a registration
    assert rejected == [
        (0, "post_created"),
        (0, "user_erased"),
        (1, "message_read"),
        (1, "message_sent"),
        (1, "user_registered"),
    ]
    assert all(r["disposition"] == "rejected" for r in erasure_log["dispositions"] if r["reason"])
