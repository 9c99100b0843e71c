"""Compaction's rule on a changelog the real Redis functions wrote: the last change per key in
sequence order is the view (docs/architecture.md, "Where state lives"); and ``home_timeline``
derived from the compacted ``posts`` and ``follows`` (:mod:`pipelines.derived`).

Events go through the keyed processor into a real redis-server; the changelog it leaves is read
back as the archiver reads it and folded by :class:`pipelines.compaction.Changes`. Expected rows
are worked out by hand from the view definitions (docs/views.md). The batches are cut so that
changes to one key come from different partitions in an order that offsets alone cannot tell
(a post in partition 1, then an unfollow in partition 0 removing it from a timeline).
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
import redis

from pipelines.archiver import CHANGELOG_DDL
from pipelines.compaction import Changes
from pipelines.derived import home_timeline
from pipelines.speed import changelog
from pipelines.speed.processor import Processor, ProcessorConfig
from tests.unit.events import T0, ev
from tests.unit.test_speed_processor import PARTITIONS, apply, ns, to_records  # noqa: F401 - fixtures

pytestmark = pytest.mark.usefixtures("spark")


def rows(df, *cols):
    return sorted(tuple(r[c] for c in cols) for r in df.collect())


@pytest.fixture
def changes(spark, redis_url, ns):  # noqa: F811 - pytest fixtures
    # users 1 and 3 are in partition 1, user 2 in partition 0 (key % 2)
    r = apply(
        redis_url,
        ns,
        [
            [
                ev("user_registered", 1, 0, handle="ann", display_name="Ann"),
                ev("user_registered", 2, 0, handle="bob", display_name="Bob"),
                ev("user_registered", 2, 0.5, handle="bobby", display_name="Bob B"),  # the last one counts
                ev("followed", 2, 1, followee_id=1),
            ],
            [ev("post_created", 1, 2, post_id=10, text="hi")],  # fanned out to tl:2
            [ev("unfollowed", 2, 3, followee_id=1)],  # ...and out of it again
            [
                ev("post_created", 1, 4, post_id=11, text="second"),
                ev("message_sent", 1, 5, message_id=5, recipient_id=2, text="yo"),
                ev("message_sent", 3, 5.5, message_id=6, recipient_id=2, text="hey"),
            ],
            [
                ev("message_read", 2, 6, message_id=5),
                ev("status_updated", 1, 7, text="busy"),
                ev("post_deleted", 1, 8, post_id=10),
                ev("followed", 2, 9, followee_id=1),  # back in: backfill of 11 (10 is deleted)
                ev("followed", 3, 9.5, followee_id=1),
                ev("unfollowed", 3, 9.7, followee_id=1),
            ],
        ],
    )
    entries = [e for p in range(PARTITIONS) for e in changelog.read(r, ns, p, 0, 100)]
    assert sorted(e["seq"] for e in entries) == list(range(1, len(entries) + 1))  # one per record
    return Changes(spark.createDataFrame(entries, CHANGELOG_DDL))


def t(s):
    return T0 + int(s * 1000)


def timeline(changes: Changes, n: int = 800, threshold: int = 1000):
    """``home_timeline`` derived from what ``changes`` compacts into ``posts`` and ``follows``
    (one compaction of an empty namespace: the upserts are the tables)."""
    return home_timeline(changes.posts(), changes.follows()[0], length=n, threshold=threshold)


def test_users_status_follows(changes):
    assert rows(changes.users(), "user_id", "handle", "display_name", "registered_time") == [
        (1, "ann", "Ann", t(0)),
        (2, "bobby", "Bob B", t(0.5)),
    ]
    assert rows(changes.user_status(), "user_id", "text", "event_time") == [(1, "busy", t(7))]
    upserts, deletes = changes.follows()
    assert rows(upserts, "user_id", "followee_id", "since_time") == [(2, 1, t(9))]
    assert rows(deletes, "user_id", "followee_id") == [(3, 1)]


def test_posts_inbox_unread(changes):
    assert rows(changes.posts(), "author_id", "post_id", "event_time", "text", "deleted", "deleted_time") == [
        (1, 10, t(2), "hi", True, t(8)),
        (1, 11, t(4), "second", False, None),
    ]
    assert rows(changes.inbox(), "recipient_id", "message_id", "sender_id", "text", "event_time", "read") == [
        (2, 5, 1, "yo", t(5), True),
        (2, 6, 3, "hey", t(5.5), False),
    ]
    assert rows(changes.unread_counts(), "user_id", "unread") == [(2, 1)]


def test_the_timeline_follows_the_sequence_not_the_offsets(changes):
    # tl:1 = its own live post 11; tl:2 = 11 by the re-follow (10 is deleted); user 3 followed
    # and unfollowed 1 (partition 1), so nothing; post 10 is deleted
    assert rows(timeline(changes), "user_id", "post_id", "author_id", "event_time") == [
        (1, 11, 1, t(4)),
        (2, 11, 1, t(4)),
    ]


@pytest.fixture
def erased(spark, redis_url, ns):  # noqa: F811 - pytest fixtures
    # users 1 and 3 are in partition 1, user 2 in partition 0; 1 is erased
    r = apply(
        redis_url,
        ns,
        [
            [
                ev("user_registered", 1, 0, handle="ann", display_name="Ann"),
                ev("status_updated", 1, 0.5, text="here"),
                ev("followed", 2, 1, followee_id=1),
                ev("followed", 1, 1, followee_id=2),
                ev("post_created", 1, 2, post_id=10, text="hi"),  # fanned out to tl:2
                ev("message_sent", 2, 3, message_id=5, recipient_id=1, text="to ann"),
                ev("message_sent", 1, 4, message_id=6, recipient_id=2, text="from ann"),
                ev("message_sent", 3, 5, message_id=7, recipient_id=2, text="from 3"),
            ],
            [ev("user_erased", 1, 6)],
            [ev("post_created", 2, 7, post_id=20, text="after")],
        ],
    )
    entries = [e for p in range(PARTITIONS) for e in changelog.read(r, ns, p, 0, 100)]
    return Changes(spark.createDataFrame(entries, CHANGELOG_DDL))


def test_an_erasure_compacts_into_deletes(erased):
    assert rows(erased.users(), "user_id") == [] and rows(erased.deletes("users"), "user_id") == [(1,)]
    assert rows(erased.user_status(), "user_id") == [] and rows(erased.deletes("user_status"), "user_id") == [
        (1,)
    ]
    assert rows(erased.posts(), "author_id", "post_id") == [(2, 20)]
    assert rows(erased.deletes("posts"), "author_id", "post_id") == [(1, 10)]
    # 1's inbox goes; the message 1 sent stays in 2's inbox, from sender 0 with no text
    assert rows(erased.inbox(), "recipient_id", "message_id", "sender_id", "text", "event_time", "read") == [
        (2, 6, 0, None, t(4), False),
        (2, 7, 3, "from 3", t(5), False),
    ]
    assert rows(erased.deletes("inbox"), "recipient_id", "message_id") == [(1, 5)]
    assert rows(erased.unread_counts(), "user_id", "unread") == [(2, 2)]
    assert rows(erased.deletes("unread_counts"), "user_id") == [(1,)]
    upserts, deletes = erased.follows()
    assert rows(upserts, "user_id") == [] and rows(deletes, "user_id", "followee_id") == [(1, 2), (2, 1)]
    # 1's post 10 left every timeline with 1; 2's own post after the erasure stays
    assert rows(timeline(erased), "user_id", "post_id") == [(2, 20)]


def test_one_post_id_of_two_authors_compacts_into_two_entries(spark, redis_url, ns):  # noqa: F811
    """docs/views.md, "Identity": 1 and 3 (partition 1) and 2 (partition 0) each write post 10;
    4 (partition 0) follows all three; 3 deletes its own. Worked by hand: tl:4 holds (10, by 2)
    and (10, by 1), newest first, then by author; (10, by 3) is deleted."""
    r = apply(
        redis_url,
        ns,
        [
            [ev("followed", 4, 0, followee_id=a) for a in (1, 2, 3)],
            [ev("post_created", a, a, post_id=10, text=f"by {a}") for a in (1, 2, 3)],
            [ev("post_deleted", 3, 4, post_id=10)],
        ],
    )
    entries = [e for p in range(PARTITIONS) for e in changelog.read(r, ns, p, 0, 100)]
    changes = Changes(spark.createDataFrame(entries, CHANGELOG_DDL))
    assert rows(timeline(changes), "user_id", "author_id", "post_id") == [
        (1, 1, 10),
        (2, 2, 10),
        (4, 1, 10),
        (4, 2, 10),
    ]
    assert rows(changes.posts(), "author_id", "post_id", "deleted") == [
        (1, 10, False),
        (2, 10, False),
        (3, 10, True),
    ]
    top = timeline(changes, n=1)  # 2's post is newer (t=2 against 1)
    assert rows(top, "user_id", "author_id", "post_id") == [(1, 1, 10), (2, 2, 10), (4, 2, 10)]


def test_the_timeline_skips_authors_above_the_threshold(spark, redis_url, ns):  # noqa: F811
    """The hybrid rule (docs/views.md): with a threshold of 1 follower, 1 (followed by 2 and 4)
    is merged at read time, so its posts are only in its own timeline; 3 (followed by 2 alone) is
    fanned out. Worked by hand with N = 2: tl:2 = 3's two newest, tl:1 = its own two newest."""
    r = apply(
        redis_url,
        ns,
        [
            [ev("followed", 2, 0, followee_id=1), ev("followed", 4, 0, followee_id=1)],
            [ev("followed", 2, 0, followee_id=3)],
            [ev("post_created", 1, k, post_id=10 + k, text="x") for k in (1, 2, 3)],
            [ev("post_created", 3, k, post_id=30 + k, text="x") for k in (1, 2, 3)],
        ],
    )
    entries = [e for p in range(PARTITIONS) for e in changelog.read(r, ns, p, 0, 100)]
    changes = Changes(spark.createDataFrame(entries, CHANGELOG_DDL))
    assert rows(timeline(changes, n=2, threshold=1), "user_id", "author_id", "post_id") == [
        (1, 1, 12),
        (1, 1, 13),
        (2, 3, 32),
        (2, 3, 33),
        (3, 3, 32),
        (3, 3, 33),
    ]


def test_compactions_round_after_round_hold_what_redis_holds(spark, redis_url, ns):  # noqa: F811
    """The compaction's fold of ``posts`` and ``follows``, round after round, and the timeline
    derived from them, against the first N of every timeline Redis holds. A seeded random log of
    follows, unfollows, posts and deletes among 6 users with N = 3, a slack of 2 and a threshold
    of 3 followers, cut into batches of 1-60 events and compacted every 1-3 batches: trims, refills
    and threshold crossings both ways happen in Redis and nowhere in the lake. The expected side
    is Redis itself, read with ZREVRANGE: the Redis functions and the derivation are two
    implementations of one view (docs/views.md)."""
    rng = random.Random(53)
    users = list(range(1, 7))
    posts: dict[int, list[int]] = {u: [] for u in users}
    events = []
    for k in range(600):
        u, t, roll = rng.choice(users), k * 0.1, rng.random()
        other = rng.choice([a for a in users if a != u])
        if roll < 0.2:
            events.append(ev("followed", u, t, followee_id=other))
        elif roll < 0.3:
            events.append(ev("unfollowed", u, t, followee_id=other))
        elif roll < 0.85 or not posts[u]:
            posts[u].append(1000 + k)
            events.append(ev("post_created", u, t - rng.random() * 5, post_id=1000 + k, text="x"))
        else:
            events.append(ev("post_deleted", u, t, post_id=rng.choice(posts[u])))
    n, threshold = 3, 3
    proc = Processor(
        ProcessorConfig(
            redis_url=redis_url, namespace=ns, timeline_length=n, timeline_slack=2, fanout_threshold=threshold
        )
    )
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    offsets: dict[int, int] = {}
    post_rows: dict[tuple[int, int], tuple] = {}  # the compacted `posts`: (author, post) -> row
    edges: dict[tuple[int, int], int] = {}  # the compacted `follows`: (user, followee) -> since
    done, rounds, at, crossings = 0, 0, 0, set()
    while at < len(events):
        for _ in range(rng.randint(1, 3)):
            batch = events[at : at + rng.randint(1, 60)]
            at += len(batch)
            per_p = defaultdict(list)
            for p, o, raw in to_records(batch, offsets):
                per_p[p].append((o, raw))
            for p, recs in per_p.items():
                proc.process(p, recs)
        entries = [
            e for p in range(PARTITIONS) for e in changelog.read(r, ns, p, 0, 10**6) if e["seq"] > done
        ]
        done = max(e["seq"] for e in entries)
        changes = Changes(spark.createDataFrame(entries, CHANGELOG_DDL))
        for row in changes.posts().collect():
            post_rows[row.author_id, row.post_id] = tuple(row)
        upserts, deletes = changes.follows()
        for row in deletes.collect():
            edges.pop((row.user_id, row.followee_id), None)
        for row in upserts.collect():
            edges[row.user_id, row.followee_id] = row.since_time
        rounds += 1
        followers = defaultdict(int)
        for _, followee in edges:
            followers[followee] += 1
        crossings |= {a for a, c in followers.items() if c > threshold}
        derived = home_timeline(
            spark.createDataFrame(list(post_rows.values()), changes.posts().schema),
            spark.createDataFrame(
                [(u, f, s) for (u, f), s in edges.items()],
                "user_id bigint, followee_id bigint, since_time bigint",
            ),
            length=n,
            threshold=threshold,
        )
        held = sorted(
            (u, int(m[:19]), int(m[19:]), int(score))
            for u in users
            for m, score in r.zrevrange(f"{ns}:tl:{u}", 0, n - 1, withscores=True)
        )
        assert rows(derived, "user_id", "post_id", "author_id", "event_time") == held, (
            f"after round {rounds} (seq {done})"
        )
    assert rounds >= 8 and crossings, (rounds, crossings)  # the log exercised what it is here for
