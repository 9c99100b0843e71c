"""The fold step on small in-memory batches: hand-worked cases of docs/views.md.

Events go in as Kafka-shaped records through the real parse, so each case is exactly what the
speed layer would see. Offsets follow list order per partition; partition = key % PARTITIONS.
"""

from __future__ import annotations

import json

import pytest

from tests.unit.events import KEY_FIELD, ev  # noqa: E402

pytestmark = pytest.mark.spark

PARTITIONS = 2


def records(spark, events, start_offsets=None):
    offsets = dict(start_offsets or {})
    rows = []
    for e in events:
        if isinstance(e, tuple):  # (key, value) as the generator writes it
            key, raw = e
            raw = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
        else:
            key = str(e.get(KEY_FIELD.get(e.get("type")), e.get("user_id"))).encode()
            raw = json.dumps(e).encode()
        p = int(key) % PARTITIONS
        o = offsets.get(p, 0)
        offsets[p] = o + 1
        rows.append((key, raw, p, o, None))
    df = spark.createDataFrame(
        rows, "key binary, value binary, partition int, offset long, timestamp timestamp"
    )
    return df, offsets


def run(spark, batches, **cfg):
    """Fold the batches one after the other; return (final state, outputs of each step)."""
    from pipelines.parse import parse_records
    from pipelines.views import State, ViewConfig, apply_batch, fold_into, materialize

    config = ViewConfig(**cfg)
    state, offsets, outs = State.empty(spark), {}, []
    for batch in batches:
        df, offsets = records(spark, batch, offsets)
        events, _ = parse_records(df)
        out = apply_batch(materialize(events), state, config)
        outs.append(out)
        state = fold_into(state, out)
        state = type(state)(**{k: materialize(v) for k, v in vars(state).items()})
    return state, outs


def rows(df, *cols):
    return sorted(tuple(r[c] for c in cols) for r in df.collect())


def test_follow_unfollow_refollow(spark):
    state, _ = run(
        spark,
        [
            [
                ev("followed", 1, 0, followee_id=2),
                ev("followed", 1, 1, followee_id=3),
                ev("unfollowed", 1, 2, followee_id=2),
            ],
            [
                ev("unfollowed", 1, 3, followee_id=3),
                ev("followed", 1, 4, followee_id=2),
                ev("unfollowed", 1, 5, followee_id=9),  # not following: no effect, not an error
            ],
        ],
    )
    assert rows(state.follows, "user_id", "followee_id") == [(1, 2)]


def test_post_then_delete_and_delete_by_someone_else(spark):
    state, outs = run(
        spark,
        [
            [
                ev("followed", 1, 0, followee_id=2),
                ev("post_created", 2, 1, post_id=20, text="a"),
                ev("post_created", 2, 2, post_id=21, text="b"),
                ev("post_deleted", 3, 3, post_id=21),  # not the author: rejected
            ],
            [
                ev("post_deleted", 2, 4, post_id=20),
                ev("post_deleted", 2, 5, post_id=20),  # already deleted: rejected
                ev("post_deleted", 2, 6, post_id=77),  # never existed: rejected
            ],
        ],
    )
    assert rows(state.home_timeline, "user_id", "post_id") == [(1, 21), (2, 21)]
    assert rows(state.posts, "post_id", "deleted") == [(20, True), (21, False)]
    reasons = sorted(r.reason for o in outs for r in o.rejected.collect())
    assert reasons == ["not_own_post", "not_own_post", "post_already_deleted"]


def test_message_read_before_and_after_arrival(spark):
    state, outs = run(
        spark,
        [
            [
                ev("message_read", 5, 0, message_id=50),  # before it arrives: rejected
                ev("message_sent", 4, 1, message_id=50, recipient_id=5, text="hi"),
                ev("message_sent", 4, 2, message_id=51, recipient_id=5, text="again"),
                ev("message_read", 6, 3, message_id=51),  # not the recipient: rejected
            ],
            [
                ev("message_read", 5, 4, message_id=50),
                ev("message_read", 5, 5, message_id=50),  # re-read: no change
                ev("message_sent", 4, 6, message_id=52, recipient_id=5, text="3rd"),
            ],
        ],
    )
    assert rows(state.inbox, "recipient_id", "message_id", "read") == [
        (5, 50, True),
        (5, 51, False),
        (5, 52, False),
    ]
    assert rows(state.unread_counts, "user_id", "unread") == [(5, 2)]
    assert sorted(r.reason for o in outs for r in o.rejected.collect()) == ["not_in_inbox", "not_in_inbox"]


def test_duplicates_within_window_only(spark):
    post = ev("post_created", 1, 0, eid="same", post_id=10, text="x")
    late = dict(post, received_time=post["received_time"] + 2 * 3600 * 1000)
    state, outs = run(spark, [[post, post], [late]], dedup_window_ms=3600 * 1000)
    dispositions = [r.disposition for o in outs for r in o.bronze.orderBy("offset").collect()]
    # the second copy is within the window; the third comes 2 h after the last sighting: applied,
    # and as a reused post_id it is rejected by the posts rules, not silently re-applied
    assert dispositions == ["applied", "duplicate", "rejected"]
    assert rows(state.posts, "post_id") == [(10,)]


def test_offline_events_ordered_by_corrected_time(spark):
    skewed = ev("post_created", 2, 50, post_id=30, text="old, device clock 1 h behind")
    skewed["device_time"] -= 3600_000
    skewed["sent_time"] -= 3600_000  # the clock offset is corrected away: event time = t=50 s
    offline = ev("post_created", 2, 10, post_id=31, text="written offline at t=10 s, sent late")
    offline["sent_time"] += 100_000
    offline["received_time"] += 100_000
    state, _ = run(
        spark,
        [
            [
                ev("followed", 1, 0, followee_id=2),
                skewed,
                offline,
                ev("post_created", 2, 20, post_id=32, text="t=20 s"),
            ]
        ],
    )
    tl = state.home_timeline.where("user_id = 1").orderBy("event_time", ascending=False).collect()
    assert [r.post_id for r in tl] == [30, 32, 31]


def test_celebrity_posts_are_merged_at_read_time_not_fanned_out(spark):
    follows = [ev("followed", u, 0, followee_id=100) for u in range(1, 5)]  # 4 followers of 100
    follows += [ev("followed", 1, 0, followee_id=200)]  # 1 follower of 200
    state, outs = run(
        spark,
        [
            follows,
            [
                ev("post_created", 100, 1, post_id=1000, text="celebrity"),
                ev("post_created", 200, 2, post_id=2000, text="normal"),
            ],
            [
                ev("unfollowed", 4, 3, followee_id=100),  # 100 drops to 3 followers: no longer a celebrity
            ],
        ],
        fanout_threshold=3,
    )
    # after batch 2: 100 is a celebrity, only its own timeline holds its post
    assert rows(outs[1].timeline_inserts, "user_id", "post_id") == [(1, 2000), (100, 1000), (200, 2000)]
    got = rows(state.home_timeline, "user_id", "post_id")
    # after batch 3: 100 has 3 followers = threshold, so its post is fanned out to 1, 2, 3
    assert got == [(1, 1000), (1, 2000), (2, 1000), (3, 1000), (100, 1000), (200, 2000)]


def test_timeline_keeps_latest_n_and_refills_after_delete(spark):
    posts = [ev("post_created", 2, i, post_id=100 + i, text=str(i)) for i in range(5)]
    state, _ = run(
        spark,
        [
            [ev("followed", 1, 0, followee_id=2), *posts],
            [
                ev("post_deleted", 2, 9, post_id=104),  # the newest: the 4th newest must come back
            ],
        ],
        timeline_length=3,
    )
    assert rows(state.home_timeline.where("user_id = 1"), "post_id") == [(101,), (102,), (103,)]


def test_invalid_events_have_no_effect(spark):
    from pipelines.parse import parse_records

    bad = [(b"1", b"{"), (b"1", json.dumps(ev("followed", 1, 0, followee_id=1)).encode())]
    df, _ = records(spark, [ev("followed", 1, 0, followee_id=2)])
    bad_df, _ = records(spark, bad, {1: 1})
    events, quarantine = parse_records(df.unionByName(bad_df))
    assert rows(quarantine, "reason") == [("bad_json",), ("self_follow",)]
    assert events.count() == 1


def test_chunked_fold_equals_one_shot_replay(spark):
    """The heart of exactness: folding a generated log in 4 batches == one batch over all of it."""
    from app_sim.generator import GeneratorConfig, generate
    from pipelines.views import State

    cfg = GeneratorConfig(users=40, seed=7, mean_followers=6, invalid_share=0.02, duplicate_share=0.03)
    evs = [(k, v) for k, v, _inj in generate(2500, cfg)]
    one, _ = run(spark, [evs], timeline_length=20, fanout_threshold=8)
    q = len(evs) // 4
    four, outs = run(
        spark,
        [evs[:q], evs[q : 2 * q], evs[2 * q : 3 * q], evs[3 * q :]],
        timeline_length=20,
        fanout_threshold=8,
    )
    for name in State.__dataclass_fields__:
        a, b = getattr(one, name), getattr(four, name)
        assert a.count() > 0, name
        assert a.exceptAll(b).count() == 0 and b.exceptAll(a).count() == 0, name
    assert sum(o.bronze.where("disposition = 'duplicate'").count() for o in outs) > 0


def test_erasure_in_the_whole_prefix_fold(spark):
    """The speed layer's hand-worked erasure logs (users apart, as in test_batch_layer) folded in
    one step, as verify's replay does; a fold step over prior state refuses an erasure."""
    from tests.unit.test_speed_processor import erasure_cases_log

    log = erasure_cases_log()
    state, (out,) = run(spark, [log], fanout_threshold=2, timeline_length=2)
    tl = {}
    for u, p in rows(state.home_timeline, "user_id", "post_id"):
        tl.setdefault(u, set()).add(p)
    assert tl == {1: {301, 302}, 30: {301, 302}, 302: {21}}
    assert rows(state.follows, "user_id", "followee_id") == [(1, 30)]
    assert rows(state.users, "user_id", "handle") == [(209, "alice")]
    assert rows(state.user_status, "user_id") == []
    assert rows(state.posts, "author_id", "post_id") == [(30, 301), (30, 302), (302, 21)]
    assert rows(state.inbox, "recipient_id", "message_id", "sender_id", "text", "read") == [
        (102, 600, 0, None, True),
        (102, 602, 0, None, True),
        (103, 601, 0, None, False),
        (103, 700, 102, "kept", False),
        (302, 800, 0, None, False),
    ]
    assert rows(state.unread_counts, "user_id", "unread") == [(102, 0), (103, 2), (302, 1)]
    assert sorted(r for (r,) in rows(out.rejected, "reason")) == ["user_erased"] * 5
    with pytest.raises(ValueError, match="whole prefix"):
        run(spark, [log[:1], log[1:]], fanout_threshold=2, timeline_length=2)
