"""What the compacted topics' publisher produces (pipelines/speed/compacted.py), worked out by hand.

Changelog entries come from the real processor and Redis functions (a redis-server per module);
the records are those the publisher would produce for them, before any Kafka is involved. The
erasure is written as the changelog entry of a ``user_erased`` (its profile gone from Redis, its
follow edges removed): the tombstone logic must give a null value for that user and every edge.
"""

from __future__ import annotations

import json

import pytest
import redis

from contract import functions
from pipelines.speed import changelog, compacted
from tests.unit.events import ev
from tests.unit.test_speed_processor import PARTITIONS, apply, ns  # noqa: F401 - fixtures


def _entries(r: redis.Redis, namespace: str) -> list[dict]:
    cut = changelog.cut(r, namespace)
    out = []
    for p, end in cut.fences.items():
        out += changelog.read(r, namespace, p, 0, end)
    return sorted(out, key=lambda e: e["seq"])


def _reader(r: redis.Redis, namespace: str):
    def read(users):
        return list(
            zip(
                r.hmget(functions.key(namespace, "users"), users),
                r.hmget(functions.key(namespace, "status"), users),
                strict=True,
            )
        )

    return read


def _last(records):
    out = {}
    for k, v in records:
        out[k] = v
    return out


def test_follows_profiles_and_an_unfollow(redis_url, ns):  # noqa: F811
    apply(
        redis_url,
        ns,
        [
            [
                ev("user_registered", 1, 0, handle="ann", display_name="Ann"),
                ev("user_registered", 2, 1, handle="bob", display_name="Bob"),
                ev("followed", 1, 2, followee_id=2),
                ev("followed", 2, 3, followee_id=1),
                ev("status_updated", 1, 4, text="hi"),
                ev("status_updated", 1, 5, text="hello"),
                ev("unfollowed", 2, 6, followee_id=1),
                ev("status_updated", 3, 7, text="no profile yet"),
            ]
        ],
    )
    r = redis.Redis.from_url(redis_url)
    entries = _entries(r, ns)
    follows = compacted.follow_records(entries)
    # one record per F+/F- change, in sequence order: 1->2 present, 2->1 present then a tombstone
    T0 = 1_700_000_000_000
    assert follows == [
        (b"1:2", str(T0 + 2000).encode()),
        (b"2:1", str(T0 + 3000).encode()),
        (b"2:1", None),
    ]
    profiles = _last(compacted.profile_records(entries, _reader(r, ns)))
    assert {k: json.loads(v) for k, v in profiles.items()} == {
        b"1": {
            "user_id": 1,
            "handle": "ann",
            "display_name": "Ann",
            "status": "hello",
            "status_time": T0 + 5000,
        },
        b"2": {"user_id": 2, "handle": "bob", "display_name": "Bob", "status": None, "status_time": None},
        b"3": {
            "user_id": 3,
            "handle": None,
            "display_name": None,
            "status": "no profile yet",
            "status_time": T0 + 7000,
        },
    }


@pytest.mark.parametrize("kind", ["U-", "E"])
def test_an_erased_user_is_a_tombstone_in_both_topics(redis_url, ns, kind):  # noqa: F811
    apply(
        redis_url,
        ns,
        [
            [
                ev("user_registered", 4, 0, handle="cat", display_name="Cat"),
                ev("user_registered", 5, 1, handle="dan", display_name="Dan"),
                ev("followed", 4, 2, followee_id=5),
                ev("followed", 5, 3, followee_id=4),
                ev("status_updated", 4, 4, text="bye soon"),
            ]
        ],
    )
    r = redis.Redis.from_url(redis_url)
    before = _entries(r, ns)
    # the erasure of user 4 as its changelog entry records it: its profile gone from Redis, both of
    # its edges removed (the Lua library's own erasure writes the state; here it is written by hand)
    r.hdel(functions.key(ns, "users"), 4)
    r.hdel(functions.key(ns, "status"), 4)
    erased = {
        "partition": 4 % PARTITIONS,
        "offset": 99,
        "seq": before[-1]["seq"] + 1,
        "disposition": "a",
        "reason": None,
        "changes": json.dumps([[kind, "4"], ["F-", "4", "5"], ["F-", "5", "4"]]),
        "timeline": None,
    }
    entries = [*before, erased]
    follows = _last(compacted.follow_records(entries))
    profiles = _last(compacted.profile_records(entries, _reader(r, ns)))
    assert follows == {b"4:5": None, b"5:4": None}
    assert profiles[b"4"] is None  # a tombstone: the key's value is null
    assert json.loads(profiles[b"5"])["handle"] == "dan"
    # and the erasure alone (a publisher run that only sees it) gives the same tombstones
    assert compacted.profile_records([erased], _reader(r, ns)) == [(b"4", None)]


def test_topic_names_follow_the_event_topic_and_namespace():
    t = compacted.topic_names("social.events", "v3")
    assert (t.profiles, t.follows) == ("social.events.v3.profiles", "social.events.v3.follows")
    with pytest.raises(ValueError, match="not a legal Kafka topic name"):
        compacted.topic_names("social events", "v3")


def test_a_bounded_run_publishes_a_prefix_in_sequence_order():
    def e(p, offset, seq):
        return {"partition": p, "offset": offset, "seq": seq}

    # partition 0 was read to its cut (seqs 1, 4, 9); partition 1 only up to seq 5 (truncated):
    # its unread part may hold seq 6..8 changes, so partition 0's seq 9 must wait
    per_p = {0: [e(0, 10, 1), e(0, 11, 4), e(0, 12, 9)], 1: [e(1, 0, 2), e(1, 1, 5)]}
    entries, back = compacted.consistent_prefix(per_p, {1})
    assert [x["seq"] for x in entries] == [1, 2, 4, 5]
    assert back == {0: 12}
    # nothing truncated: everything, in sequence order, and no position held back
    entries, back = compacted.consistent_prefix(per_p, set())
    assert [x["seq"] for x in entries] == [1, 2, 4, 5, 9] and back == {}
