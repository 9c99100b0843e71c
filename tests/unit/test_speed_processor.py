"""The keyed processor and its Redis functions, against a real redis-server: docs/views.md by hand.

Events go through :class:`pipelines.speed.processor.Processor` exactly as the stream sends them
(raw record bytes, per partition, in offset order) into a redis-server started for this module;
the expected views are worked out by hand from the specification. The last tests check the
property the design rests on: the state does not depend on how partitions interleave or how the
log is cut into batches, and it equals the definition of every view computed from the log alone.
"""

from __future__ import annotations

import json
import random
import uuid
from collections import defaultdict

import pytest
import redis

from contract import functions
from pipelines.speed.processor import Processor, ProcessorConfig
from tests.unit.events import KEY_FIELD, T0, ev

PARTITIONS = 2


@pytest.fixture
def ns():
    return f"t{uuid.uuid4().hex[:8]}"


def to_records(events, offsets=None):
    """Kafka-shaped (partition, offset, value) in log order; partition = key % PARTITIONS."""
    offsets = offsets if offsets is not None else {}
    out = []
    for e in events:
        if isinstance(e, tuple):
            key, raw = e
            raw = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
            key = int(key)
        else:
            key, raw = int(e.get(KEY_FIELD.get(e.get("type")), e.get("user_id"))), json.dumps(e).encode()
        p = key % PARTITIONS
        o = offsets.get(p, 0)
        offsets[p] = o + 1
        out.append((p, o, raw))
    return out


def apply(url, ns, batches, **cfg):
    """Apply each batch (its records per partition, partitions one after the other)."""
    proc = Processor(ProcessorConfig(redis_url=url, namespace=ns, **cfg))
    offsets: dict[int, int] = {}
    for batch in batches:
        per_p = defaultdict(list)
        for p, o, raw in to_records(batch, offsets):
            per_p[p].append((o, raw))
        for p, recs in per_p.items():
            proc.process(p, recs)
    return redis.Redis.from_url(url, decode_responses=True)


def timeline(r, ns, u, n=800):
    """The view's post ids: the first N of the kept timeline (which may hold up to N + slack)."""
    return [post for post, _author in timeline_posts(r, ns, u, n)]


def timeline_posts(r, ns, u, n=800):
    """The view as (post, author): a member is the post id then the author id, 19 digits each."""
    return [(int(m[:19]), int(m[19:])) for m in r.zrevrange(functions.key(ns, "tl", u), 0, n - 1)]


def changelog(r, ns, p):
    return [fields for _id, fields in r.xrange(functions.key(ns, "changelog", p))]


def reasons(r, ns):
    return sorted(f["r"] for p in range(PARTITIONS) for f in changelog(r, ns, p) if f["d"] in "rq")


def test_follow_unfollow_refollow(redis_url, ns):
    r = apply(
        redis_url,
        ns,
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
    assert r.smembers(functions.key(ns, "following", 1)) == {"2"}
    assert r.smembers(functions.key(ns, "followers", 2)) == {"1"}
    assert r.scard(functions.key(ns, "followers", 3)) == 0


def test_post_then_delete_and_delete_by_someone_else(redis_url, ns):
    r = apply(
        redis_url,
        ns,
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
    assert timeline(r, ns, 1) == [21] and timeline(r, ns, 2) == [21]
    assert r.get(functions.key(ns, "p", 2, 20)) is None
    assert json.loads(r.get(functions.key(ns, "p", 2, 21))) == {
        "post_id": 21,
        "author_id": 2,
        "text": "b",
        "event_time": T0 + 2000,
    }
    assert reasons(r, ns) == ["not_own_post", "not_own_post", "post_already_deleted"]


def test_one_post_id_used_by_two_authors_is_two_posts(redis_url, ns):
    """docs/views.md, "Identity": a post is (author, post). Worked by hand: 2 and 3 both write post
    20 (3 later); 1 follows both. Each author's own timeline holds only its own post 20; 1 sees
    both, 3's first (newer); 3's delete removes 3's post alone; 2's second create of 20 is reused."""
    batches = [
        [
            ev("followed", 1, 0, followee_id=2),
            ev("followed", 1, 0, followee_id=3),
            ev("post_created", 2, 1, post_id=20, text="by two"),
            ev("post_created", 3, 2, post_id=20, text="by three"),
        ],
        [ev("post_created", 2, 3, post_id=20, text="again")],
        [ev("post_deleted", 3, 4, post_id=20)],
    ]
    r = apply(redis_url, ns, batches[:2])
    assert timeline_posts(r, ns, 1) == [(20, 3), (20, 2)]
    assert timeline_posts(r, ns, 2) == [(20, 2)] and timeline_posts(r, ns, 3) == [(20, 3)]
    assert json.loads(r.get(functions.key(ns, "p", 2, 20)))["text"] == "by two"
    assert json.loads(r.get(functions.key(ns, "p", 3, 20)))["text"] == "by three"
    assert reasons(r, ns) == ["reused_id"]
    after = ns + "d"
    r = apply(redis_url, after, batches)
    assert timeline_posts(r, after, 1) == [(20, 2)]
    assert timeline_posts(r, after, 2) == [(20, 2)] and timeline_posts(r, after, 3) == []
    assert json.loads(r.get(functions.key(after, "p", 2, 20)))["text"] == "by two"
    assert reasons(r, after) == ["reused_id"]


def test_equal_times_and_post_ids_order_by_author(redis_url, ns):
    """Ties in a timeline: event time, then post id, then author id, all descending."""
    r = apply(
        redis_url,
        ns,
        [
            [
                ev("followed", 1, 0, followee_id=2),
                ev("followed", 1, 0, followee_id=3),
                ev("post_created", 3, 1, post_id=20, text="x"),
                ev("post_created", 2, 1, post_id=20, text="y"),
                ev("post_created", 2, 1, post_id=21, text="z"),
            ]
        ],
    )
    assert timeline_posts(r, ns, 1) == [(21, 2), (20, 3), (20, 2)]


def test_message_read_before_and_after_arrival(redis_url, ns):
    r = apply(
        redis_url,
        ns,
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
    msgs = {int(k): json.loads(v) for k, v in r.hgetall(functions.key(ns, "msgs", 5)).items()}
    assert {k: m["read"] for k, m in msgs.items()} == {50: True, 51: False, 52: False}
    assert msgs[50] == {"message_id": 50, "sender_id": 4, "text": "hi", "event_time": T0 + 1000, "read": True}
    assert r.hget(functions.key(ns, "unread"), 5) == "2"
    assert [int(m) for m in r.zrevrange(functions.key(ns, "inbox", 5), 0, -1)] == [52, 51, 50]
    assert reasons(r, ns) == ["not_in_inbox", "not_in_inbox"]


def test_duplicates_within_window_only(redis_url, ns):
    post = ev("post_created", 1, 0, eid="same", post_id=10, text="x")
    late = dict(post, received_time=post["received_time"] + 2 * 3600 * 1000)
    r = apply(redis_url, ns, [[post, post], [late]], dedup_window_ms=3600 * 1000)
    # the second copy is within the window; the third comes 2 h after the last sighting: not a
    # duplicate, and as a reused post_id it is rejected by the posts rules, not re-applied
    assert [f["d"] for f in changelog(r, ns, 1)] == ["a", "d", "r"]
    assert r.hgetall(functions.key(ns, "stats", 1)) == {"applied": "1", "duplicates": "1", "rejected": "1"}


@pytest.mark.parametrize("group_size", [1, 2, 5])
def test_forgetting_event_ids_does_not_depend_on_how_the_log_is_grouped(redis_url, ns, group_size):
    # window W = 1 h, grace G = 1 h: after each event the memory holds the ids received at most
    # W + G before the partition's newest received_time (docs/architecture.md, "Dedup")
    h = 3600.0

    def status(eid, at_h):
        return ev("status_updated", 1, at_h * h, eid=eid, text=eid)

    log = [
        status("A", 0),  # applied; memory {A@0}
        status("B", 3),  # applied; newest 3 h, so A (0 h < 1 h) is forgotten: memory {B@3}
        status("A", 0.5),  # A is not remembered: applied, and forgotten at once (0.5 h < 1 h)
        status("A", 0.6),  # the same again: applied
        status("B", 3.5),  # B seen 0.5 h before: a duplicate; memory {B@3.5}
    ]
    r = apply(
        redis_url,
        ns,
        [log],
        dedup_window_ms=int(h * 1000),
        dedup_grace_ms=int(h * 1000),
        group_size=group_size,
    )
    p = 1 % PARTITIONS
    assert [f["d"] for f in changelog(r, ns, p)] == ["a", "a", "a", "a", "d"]
    b = str(T0 + int(3.5 * h * 1000))
    assert r.zrange(functions.key(ns, "seenq", p), 0, -1, withscores=True) == [("B", float(b))]
    assert r.hget(functions.key(ns, "hwm"), p) == b
    assert r.hget(functions.key(ns, "fence"), p) == "5"
    # and after the first three alone: A, received 0.5 h, is below the bound at once
    apply(
        redis_url,
        f"{ns}x",
        [log[:3]],
        dedup_window_ms=int(h * 1000),
        dedup_grace_ms=int(h * 1000),
        group_size=group_size,
    )
    assert r.zrange(functions.key(f"{ns}x", "seenq", p), 0, -1, withscores=True) == [("B", T0 + 3 * h * 1000)]


def test_offline_events_ordered_by_corrected_time(redis_url, ns):
    skewed = ev("post_created", 2, 50, post_id=30, text="old, device clock 1 h behind")
    skewed["device_time"] -= 3600_000
    skewed["sent_time"] -= 3600_000  # the clock offset is corrected away: event time = t=50 s
    offline = ev("post_created", 2, 10, post_id=31, text="written offline at t=10 s, sent late")
    offline["sent_time"] += 100_000
    offline["received_time"] += 100_000
    r = apply(
        redis_url,
        ns,
        [
            [
                ev("followed", 1, 0, followee_id=2),
                skewed,
                offline,
                ev("post_created", 2, 20, post_id=32, text="t=20 s"),
            ]
        ],
    )
    assert timeline(r, ns, 1) == [30, 32, 31]


def test_celebrity_posts_are_merged_at_read_time_not_fanned_out(redis_url, ns):
    follows = [ev("followed", u, 0, followee_id=100) for u in range(1, 5)]  # 4 followers of 100
    follows += [ev("followed", 1, 0, followee_id=200)]
    posts = [
        ev("post_created", 100, 1, post_id=1000, text="celebrity"),
        ev("post_created", 200, 2, post_id=2000, text="normal"),
    ]
    r = apply(redis_url, ns, [follows, posts], fanout_threshold=3)
    assert r.smembers(functions.key(ns, "celebs")) == {"100"}
    assert {u: timeline(r, ns, u) for u in (1, 2, 3, 4, 100, 200)} == {
        1: [2000],
        2: [],
        3: [],
        4: [],
        100: [1000],
        200: [2000],
    }
    # 100 drops to 3 followers = the threshold: no longer a celebrity, fanned out to 1, 2, 3
    apply(redis_url, ns, [[]])
    Processor(ProcessorConfig(redis_url=redis_url, namespace=ns, fanout_threshold=3)).process(
        0,
        [
            (
                len([e for e in follows + posts if (e.get("user_id")) % 2 == 0]),
                json.dumps(ev("unfollowed", 4, 3, followee_id=100)).encode(),
            )
        ],
    )
    assert r.smembers(functions.key(ns, "celebs")) == set()
    assert {u: timeline(r, ns, u) for u in (1, 2, 3, 4)} == {1: [2000, 1000], 2: [1000], 3: [1000], 4: []}


def test_the_read_time_merge_by_hand(redis_url, ns):
    """FCALL_RO social_timeline: tl:u merged with the celebrities' posts, newest first by (corrected
    event time, post_id), every prefix; celebrities' sources read in pages (a refill is needed)."""
    follows = [ev("followed", u, 0, followee_id=c) for u in (1, 2) for c in (100, 200, 400, 500)]
    follows.append(ev("followed", 1, 0, followee_id=300))  # 300: one follower, fanned out
    posts = [ev("post_created", 100, 15 + i, post_id=1000 + i, text="c") for i in range(1, 11)]
    posts += [
        ev("post_created", 200, 22, post_id=2001, text="tie with 1007"),
        ev("post_created", 200, 25, post_id=2002, text="tie with 1010 and 3001"),
        ev("post_created", 300, 25, post_id=3001, text="fanned out, tie"),
        ev("post_created", 300, 15, post_id=3002, text="fanned out"),
        ev("post_created", 1, 24, post_id=1500, text="own"),
        ev("post_created", 400, 5, post_id=4001, text="old"),
        ev("post_created", 500, 6, post_id=5001, text="old"),
    ]
    r = apply(redis_url, ns, [follows, posts], fanout_threshold=1)
    assert r.smembers(functions.key(ns, "celebs")) == {"100", "200", "400", "500"}
    assert timeline(r, ns, 1) == [3001, 1500, 3002]  # the fanned-out part only
    # by hand: t25: 3001 > 2002 > 1010 (post_id desc); t24: 1500, 1009; t23: 1008; t22: 2001, 1007;
    # t21..16: 1006..1001; t15: 3002; then 5001 (t6), 4001 (t5)
    want = {
        1: [3001, 2002, 1010, 1500, 1009, 1008, 2001, 1007, 1006, 1005, 1004, 1003, 1002, 1001, 3002, 5001, 4001],
        2: [2002, 1010, 1009, 1008, 2001, 1007, 1006, 1005, 1004, 1003, 1002, 1001, 5001, 4001],
        300: [3001, 3002],
        7: [],
    }  # fmt: skip
    for limit in range(0, 20):  # 5 sources: pages of max(4, 2 * limit / 5), so 100's run out
        got = read_timelines(redis_url, ns, list(want), limit)
        assert got == {u: w[:limit] for u, w in want.items()}, limit
    as_of = read_timelines(redis_url, ns, [1], 5, as_of=True)[1][1]
    assert as_of == {str(p): int(o) for p, o in r.hgetall(functions.key(ns, "fence")).items()}
    assert as_of and all(o > 0 for o in as_of.values())


def test_crossing_the_threshold_upwards_removes_and_refills(redis_url, ns):
    # 1 follows 100 and 200; timelines hold 2 posts; 100 becomes a celebrity when 2 more follow it
    evs = [
        ev("followed", 1, 0, followee_id=100),
        ev("followed", 1, 0, followee_id=200),
        ev("post_created", 200, 1, post_id=2001, text="old normal"),
        ev("post_created", 200, 2, post_id=2002, text="normal"),
        ev("post_created", 100, 3, post_id=1003, text="c1"),
        ev("post_created", 100, 4, post_id=1004, text="c2"),
    ]
    r = apply(redis_url, ns, [evs], fanout_threshold=2, timeline_length=2)
    assert timeline(r, ns, 1, 2) == [1004, 1003]
    apply2 = [ev("followed", 3, 5, followee_id=100), ev("followed", 5, 5, followee_id=100)]
    proc = Processor(
        ProcessorConfig(redis_url=redis_url, namespace=ns, fanout_threshold=2, timeline_length=2)
    )
    proc.process(1, [(100, json.dumps(apply2[0]).encode()), (101, json.dumps(apply2[1]).encode())])
    # 100 now has 3 followers > 2: its posts leave 1's timeline, refilled with 200's two posts
    assert r.smembers(functions.key(ns, "celebs")) == {"100"}
    assert timeline(r, ns, 1, 2) == [2002, 2001]


def test_timeline_keeps_latest_n_and_refills_after_delete(redis_url, ns):
    posts = [ev("post_created", 2, i, post_id=100 + i, text=str(i)) for i in range(5)]
    r = apply(
        redis_url,
        ns,
        [[ev("followed", 1, 0, followee_id=2), *posts], [ev("post_deleted", 2, 9, post_id=104)]],
        timeline_length=3,
    )
    assert timeline(r, ns, 1, 3) == [103, 102, 101]
    assert timeline(r, ns, 2, 3) == [103, 102, 101]


def test_invalid_records_are_quarantined_with_their_reason(redis_url, ns):
    bad = [(1, b"{"), (1, json.dumps(ev("followed", 1, 0, followee_id=1)).encode()), (1, b"\xff\xfe")]
    r = apply(redis_url, ns, [[ev("followed", 1, 0, followee_id=2), *bad]])
    assert [(f["d"], f.get("r")) for f in changelog(r, ns, 1)] == [
        ("a", None),
        ("q", "bad_json"),
        ("q", "self_follow"),
        ("q", "not_utf8"),
    ]
    assert functions.fences(r, ns) == {1: 4}


def test_a_rerun_after_a_crash_changes_nothing(redis_url, ns):
    evs = [ev("followed", 1, 0, followee_id=2)] + [
        ev("post_created", 2, i, post_id=10 + i, text="p") for i in range(1, 6)
    ]
    recs = to_records(evs)
    proc = Processor(ProcessorConfig(redis_url=redis_url, namespace=ns))
    for p in (0, 1):
        proc.process(p, [(o, v) for q, o, v in recs if q == p])
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    before = {k: r.dump(k) for k in r.scan_iter(f"{ns}:*")}
    for p in (0, 1):  # the same records again, as a re-run batch would send them
        again = proc.process(p, [(o, v) for q, o, v in recs if q == p])
        assert again.skipped == again.records and again.applied == 0
    assert {k: r.dump(k) for k in r.scan_iter(f"{ns}:*")} == before


# ---------------------------------------------------------------------------------------------
# The definition, computed from the log alone (docs/views.md), and interleaving independence.
# ---------------------------------------------------------------------------------------------
def definition(records, n, threshold, window):
    """Every view straight from its definition over the log (no incremental maintenance)."""
    import contract

    follows, posts, pids, inbox, status = defaultdict(set), {}, defaultdict(dict), defaultdict(dict), {}
    seen, erased, sender = defaultdict(dict), set(), {}
    for p, _o, raw in sorted(records, key=lambda x: (x[0], x[1])):  # per partition, in log order
        e, reason = contract.parse_and_validate(raw)
        if reason:
            continue
        prev = seen[p].get(e["event_id"])
        seen[p][e["event_id"]] = max(prev or e["received_time"], e["received_time"])
        if prev is not None and prev >= e["received_time"] - window:
            continue
        u, t = e["user_id"], e["type"]
        et = e["device_time"] + e["received_time"] - e["sent_time"]
        if (e["recipient_id"] if t == "message_sent" else u) in erased:
            continue  # after its key user's erasure in this partition: rejected
        if t == "user_erased":
            erased.add(u)
        elif t == "followed":
            follows[u].add(e["followee_id"])
        elif t == "unfollowed":
            follows[u].discard(e["followee_id"])
        elif t == "post_created" and e["post_id"] not in pids[u]:  # a post is (author, post)
            pids[u][e["post_id"]] = True
            posts[u, e["post_id"]] = et
        elif t == "post_deleted" and pids[u].get(e["post_id"]):
            pids[u][e["post_id"]] = False
            del posts[u, e["post_id"]]
        elif t == "message_sent" and e["message_id"] not in inbox[e["recipient_id"]]:
            inbox[e["recipient_id"]][e["message_id"]] = False
            sender[e["message_id"]] = (u, e["text"])
        elif t == "message_read" and e["message_id"] in inbox[u]:
            inbox[u][e["message_id"]] = True
        elif t == "status_updated":
            status[u] = e["text"]
    # erasure: the erased users' rows, their posts and the edges to them leave every view
    follows = {u: {a for a in fs if a not in erased} for u, fs in follows.items() if u not in erased}
    follows = defaultdict(set, follows)
    posts = {(a, pid): et for (a, pid), et in posts.items() if a not in erased}
    inbox = {r: box for r, box in inbox.items() if r not in erased}
    status = {u: text for u, text in status.items() if u not in erased}
    messages = {
        r: {m: (0, None) if sender[m][0] in erased else sender[m] for m in box} for r, box in inbox.items()
    }
    followers = defaultdict(int)
    for fs in follows.values():
        for a in fs:
            followers[a] += 1
    users = set(follows) | {a for a, _ in posts}
    tls = {}
    for u in users:
        sources = {u} | {a for a in follows[u] if followers[a] <= threshold}
        mine = sorted(((et, pid, a) for (a, pid), et in posts.items() if a in sources), reverse=True)[:n]
        tls[u] = [pid for _, pid, _a in mine]
    unread = {u: sum(not read for read in box.values()) for u, box in inbox.items()}
    return tls, unread, status, follows, messages


def home_timelines(records, n, window):
    """home timeline(u) as the BRIEF defines it, whatever the fan-out: the posts of u and of all
    follows(u), newest first by (corrected event time, post_id), the first n."""
    tls, *_ = definition(records, n, threshold=len(records) + 1, window=window)  # no celebrities
    return tls


def read_timelines(url, ns, users, n, as_of=False):
    """What the API serves: ServingReader.timeline (the library's read-time merge): post ids per
    user, or (post ids, as_of)."""
    import asyncio

    from contract.serving import ServingReader

    async def read_all():
        client = redis.asyncio.Redis.from_url(url)
        try:
            reader = ServingReader(client, ns)
            return {u: await reader.timeline(u, n) for u in users}
        finally:
            await client.aclose()

    got = {u: ([p["post_id"] for p in posts], at) for u, (posts, at) in asyncio.run(read_all()).items()}
    return got if as_of else {u: ids for u, (ids, _at) in got.items()}


def state_of(url, ns, n):
    r = redis.Redis.from_url(url, decode_responses=True)
    tls = {}
    for k in r.scan_iter(f"{ns}:tl:*"):
        u = int(k.rsplit(":", 1)[1])
        tls[u] = [int(m[:19]) for m in r.zrevrange(k, 0, n - 1)]  # member: post, then author
    unread = {int(u): int(n) for u, n in r.hgetall(f"{ns}:unread").items()}
    status = {int(u): json.loads(v)["text"] for u, v in r.hgetall(f"{ns}:status").items()}
    follows = {
        int(k.rsplit(":", 1)[1]): {int(x) for x in r.smembers(k)} for k in r.scan_iter(f"{ns}:following:*")
    }
    messages = {}
    for k in r.scan_iter(f"{ns}:msgs:*"):
        box = {int(m): json.loads(v) for m, v in r.hgetall(k).items()}
        messages[int(k.rsplit(":", 1)[1])] = {m: (b["sender_id"], b["text"]) for m, b in box.items()}
    return tls, unread, status, follows, messages


@pytest.mark.parametrize("erasure_share", [0.0, 0.003])
def test_any_interleaving_and_batching_gives_the_definition(redis_url, erasure_share):
    from app_sim.generator import GeneratorConfig, generate

    cfg = GeneratorConfig(
        users=40,
        seed=11,
        mean_followers=6,
        invalid_share=0.02,
        duplicate_share=0.03,
        erasure_share=erasure_share,
    )
    evs = [(k, v) for k, v, _inj in generate(3000, cfg)]
    recs = to_records(evs)
    n, threshold, window = 20, 8, 24 * 3600 * 1000
    want_tl, want_unread, want_status, want_follows, want_msgs = definition(recs, n, threshold, window)
    want_home = home_timelines(recs, n, window)
    users = sorted({*want_home, *want_follows})
    erasures = sum(1 for _k, v in evs if isinstance(v, dict) and v["type"] == "user_erased")
    assert (erasures >= 3) == (erasure_share > 0), erasures
    if erasure_share:  # the log exercises the erasure: anonymised messages are left in inboxes
        assert any(s == (0, None) for box in want_msgs.values() for s in box.values())
    assert sum(map(len, want_tl.values())) > 100 and any(len(t) == n for t in want_tl.values())
    per_p = defaultdict(list)
    for p, o, raw in recs:
        per_p[p].append((o, raw))
    rng = random.Random(5)
    for trial in range(3):
        ns = f"mix{trial}{uuid.uuid4().hex[:6]}"
        proc = Processor(
            ProcessorConfig(
                redis_url=redis_url,
                namespace=ns,
                timeline_length=n,
                timeline_slack=rng.choice([0, 1, 5]),
                fanout_threshold=threshold,
                group_size=rng.choice([1, 7, 200]),
            )
        )
        cursors = {p: 0 for p in per_p}
        while any(cursors[p] < len(per_p[p]) for p in per_p):  # random partition, random run length
            p = rng.choice([p for p in per_p if cursors[p] < len(per_p[p])])
            k = rng.randint(1, 400)
            proc.process(p, per_p[p][cursors[p] : cursors[p] + k])
            cursors[p] += k
        tls, unread, status, follows, msgs = state_of(redis_url, ns, n)
        assert {u: t for u, t in tls.items() if t} == {u: t for u, t in want_tl.items() if t}
        assert {u: c for u, c in unread.items() if c} == {u: c for u, c in want_unread.items() if c}
        assert status == want_status
        assert {u: f for u, f in follows.items() if f} == {u: f for u, f in want_follows.items() if f}
        assert {u: m for u, m in msgs.items() if m} == {u: m for u, m in want_msgs.items() if m}
        # reads cannot tell fan-out on write from the read-time merge (BRIEF: home timeline)
        celebs = redis.Redis.from_url(redis_url).scard(functions.key(ns, "celebs"))
        assert celebs > 0
        assert read_timelines(redis_url, ns, users, n) == {u: want_home.get(u, []) for u in users}
        assert {u: t[:5] for u, t in read_timelines(redis_url, ns, users, 5).items()} == {
            u: want_home.get(u, [])[:5] for u in users
        }


# ---------------------------------------------------------------------------------------------
# Erasure (docs/views.md, "Erasure"): hand-worked logs.
# ---------------------------------------------------------------------------------------------
def stepper(url, ns, **cfg):
    """(client, step): ``step(events)`` applies the next events of one log, offsets going on."""
    proc = Processor(ProcessorConfig(redis_url=url, namespace=ns, **cfg))
    offsets: dict[int, int] = {}

    def step(events):
        per_p = defaultdict(list)
        for p, o, raw in to_records(events, offsets):
            per_p[p].append((o, raw))
        for p, recs in sorted(per_p.items()):
            proc.process(p, recs)

    return redis.Redis.from_url(url, decode_responses=True), step


def shift_users(events, by):
    """The same events with every user id + ``by`` (even: the partitions stay) and new event ids."""
    out = []
    for e in events:
        e = dict(e, event_id=f"{e['event_id']}+{by}")
        for f in ("user_id", "followee_id", "recipient_id"):
            if f in e:
                e[f] += by
        out.append(e)
    return out


def erasure_cases_log():
    """Every hand-worked erasure case in one log, each on its own users (ids shifted by 100s):
    the batch layer's tests run them all at once."""
    authors = [e for part in erasure_authors_log() for e in part]
    messages = [e for part in erasure_messages_log() for e in part]
    return (
        authors
        + shift_users(messages, 100)
        + shift_users(erasure_reregister_log(), 200)
        + shift_users(erasure_cross_partition_log(), 300)
    )


def erasure_authors_log():
    """1, 2 follow 10 (2 followers: fanned out); 3, 4, 5 follow 20 (3 > threshold 2: merged at read
    time); 1 and 10 follow 30. Timelines hold N = 2."""
    before = [
        *(ev("followed", u, 0, followee_id=10) for u in (1, 2)),
        *(ev("followed", u, 0, followee_id=20) for u in (3, 4, 5)),
        *(ev("followed", u, 0, followee_id=30) for u in (1, 10)),
        ev("user_registered", 10, 0, handle="ten", display_name="Ten"),
        ev("status_updated", 10, 0, text="status of 10"),
        ev("post_created", 30, 1, post_id=301, text="30 a"),
        ev("post_created", 30, 2, post_id=302, text="30 b"),
        ev("post_created", 10, 3, post_id=101, text="10 a"),
        ev("post_created", 10, 4, post_id=102, text="10 b"),
        ev("post_created", 10, 4.5, post_id=103, text="10 deleted"),
        ev("post_deleted", 10, 4.6, post_id=103),
        ev("post_created", 20, 5, post_id=201, text="celebrity"),
    ]
    erase = [ev("user_erased", 10, 6), ev("user_erased", 20, 6)]
    after = [
        ev("post_created", 10, 7, post_id=104, text="after"),  # 10's partition: user_erased
        ev("user_erased", 10, 8),  # erasing twice: user_erased, no effect
        ev("followed", 2, 9, followee_id=20),  # 2's partition: applied, no edge to an erased user
    ]
    return before, erase, after


def test_erasing_an_author_and_a_celebrity(redis_url, ns):
    before, erase, after = erasure_authors_log()
    r, step = stepper(redis_url, ns, fanout_threshold=2, timeline_length=2, timeline_slack=0)
    step(before)
    assert {u: timeline(r, ns, u, 2) for u in (1, 2, 10, 20, 3)} == {
        1: [102, 101],
        2: [102, 101],
        10: [102, 101],
        20: [201],
        3: [],  # 20's posts are merged at read time
    }
    assert r.smembers(functions.key(ns, "celebs")) == {"20"}
    step(erase + after)
    # 1's timeline refilled exactly from the older posts of 30; 2 follows nobody left
    assert {u: timeline(r, ns, u, 2) for u in (1, 2, 3, 30)} == {1: [302, 301], 2: [], 3: [], 30: [302, 301]}
    for gone in ("tl:10", "tl:20", "posts:10", "posts:20", "pids:10", "following:10", "followers:10",
                 "followers:20", "p:101", "p:102", "p:103", "p:201"):  # fmt: skip
        assert not r.exists(functions.key(ns, *gone.split(":"))), gone
    assert {u: r.smembers(functions.key(ns, "following", u)) for u in (1, 2, 3)} == {
        1: {"30"},
        2: set(),
        3: set(),
    }
    assert r.smembers(functions.key(ns, "followers", 30)) == {"1"}
    assert r.smembers(functions.key(ns, "celebs")) == set()
    assert r.smembers(functions.key(ns, "erased")) == {"10", "20"}
    assert r.hget(functions.key(ns, "users"), 10) is None and r.hget(functions.key(ns, "status"), 10) is None
    # the read-time merge finds nothing of 20 either
    assert read_timelines(redis_url, ns, [3, 1], 10) == {3: [], 1: [302, 301]}
    assert reasons(r, ns) == ["user_erased", "user_erased"]
    # the erasure's changelog entry deletes every row of 10 (the deleted post's tombstone too)
    entry = [json.loads(f["c"]) for f in changelog(r, ns, 0) if f.get("c") and '"U-"' in f["c"]]
    assert len(entry) == 1
    kinds = sorted(tuple(c[:3]) for c in entry[0] if c[0] in ("P-", "U-", "S-", "F-"))
    assert kinds == [("F-", "1", "10"), ("F-", "10", "30"), ("F-", "2", "10"), ("P-", "10", "101"),
                     ("P-", "10", "102"), ("P-", "10", "103"), ("S-", "10"), ("U-", "10")]  # fmt: skip


def erasure_messages_log():
    """1 (erased) has 2 messages from 2 and 3 (one read); 1 sent 600, 602 to 2 (600 read) and 601
    to 3; 2 sent 700 to 3. Partitions: 1 -> 1, 2 -> 0, 3 -> 1."""
    before = [
        ev("message_sent", 2, 0, message_id=500, recipient_id=1, text="to 1"),
        ev("message_sent", 3, 1, message_id=501, recipient_id=1, text="to 1 again"),
        ev("message_read", 1, 2, message_id=500),
        ev("message_sent", 1, 3, message_id=600, recipient_id=2, text="secret"),
        ev("message_sent", 1, 4, message_id=601, recipient_id=3, text="secret 2"),
        ev("message_sent", 1, 5, message_id=602, recipient_id=2, text="secret 3"),
        ev("message_read", 2, 6, message_id=600),
        ev("message_sent", 2, 7, message_id=700, recipient_id=3, text="kept"),
    ]
    erase = [ev("user_erased", 1, 8)]
    after = [
        ev("message_sent", 3, 9, message_id=503, recipient_id=1, text="too late"),  # user_erased
        ev("message_read", 1, 10, message_id=501),  # user_erased
        ev("message_read", 2, 11, message_id=602),  # applied: 2 reads the anonymised message
    ]
    return before, erase, after


def test_erasing_a_user_with_messages_in_both_directions(redis_url, ns):
    before, erase, after = erasure_messages_log()
    r, step = stepper(redis_url, ns)
    step(before)
    assert r.hgetall(functions.key(ns, "unread")) == {"1": "1", "2": "1", "3": "2"}
    step(erase + after)

    def inbox(u):
        return {int(k): json.loads(v) for k, v in r.hgetall(functions.key(ns, "msgs", u)).items()}

    assert inbox(1) == {} and not r.exists(functions.key(ns, "inbox", 1))
    assert inbox(2) == {
        600: {"message_id": 600, "sender_id": 0, "text": None, "event_time": T0 + 3000, "read": True},
        602: {"message_id": 602, "sender_id": 0, "text": None, "event_time": T0 + 5000, "read": True},
    }
    assert inbox(3) == {
        601: {"message_id": 601, "sender_id": 0, "text": None, "event_time": T0 + 4000, "read": False},
        700: {"message_id": 700, "sender_id": 2, "text": "kept", "event_time": T0 + 7000, "read": False},
    }
    assert [int(m) for m in r.zrevrange(functions.key(ns, "inbox", 2), 0, -1)] == [602, 600]
    # unread == the unread rows of each inbox; 1's counter is gone
    assert r.hgetall(functions.key(ns, "unread")) == {"2": "0", "3": "2"}
    assert {u: r.smembers(functions.key(ns, "sent", u)) for u in (1, 2, 3)} == {
        1: set(),
        2: {"3:700"},
        3: set(),
    }
    assert reasons(r, ns) == ["user_erased", "user_erased"]


def erasure_reregister_log():
    return [
        ev("user_registered", 7, 0, handle="alice", display_name="Alice"),
        ev("user_erased", 7, 1),
        ev("user_registered", 9, 2, handle="alice", display_name="Alice again"),  # a new id
        ev("user_registered", 7, 3, handle="alice", display_name="Alice"),  # the old id: user_erased
    ]


def test_erase_then_register_the_same_handle_again(redis_url, ns):
    r, step = stepper(redis_url, ns)
    step(erasure_reregister_log())
    assert r.hgetall(functions.key(ns, "users")) == {
        "9": json.dumps({"handle": "alice", "display_name": "Alice again"}, separators=(",", ":"))
    }
    assert reasons(r, ns) == ["user_erased"]


def erasure_cross_partition_log():
    """1's erasure (partition 1) and, in partition 0, a message from 1 to 2 and 2's follow of 1,
    both with earlier event times."""
    return [
        ev("user_registered", 1, 0, handle="one", display_name="One"),
        ev("post_created", 1, 1, post_id=11, text="by 1"),
        ev("user_erased", 1, 5),
        ev("message_sent", 1, 2, message_id=800, recipient_id=2, text="from 1"),
        ev("followed", 2, 3, followee_id=1),
        ev("post_created", 2, 4, post_id=21, text="by 2"),
    ]


def test_an_erasure_applied_before_earlier_events_of_another_partition(redis_url):
    """Whichever partition Redis applies first, the same state (and nothing of partition 0 is
    rejected)."""
    from pipelines.speed.compare import compare_namespaces

    recs = to_records(erasure_cross_partition_log())
    states = []
    for order in ((1, 0), (0, 1)):
        ns = f"order{order[0]}{uuid.uuid4().hex[:6]}"
        proc = Processor(ProcessorConfig(redis_url=redis_url, namespace=ns))
        for p in order:
            got = proc.process(p, [(o, v) for q, o, v in recs if q == p])
            assert got.applied == got.records  # nothing in partition 0 is rejected, in either order
        states.append(ns)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    for ns in states:
        assert json.loads(r.hget(functions.key(ns, "msgs", 2), 800)) == {
            "message_id": 800, "sender_id": 0, "text": None, "event_time": T0 + 2000, "read": False,
        }  # fmt: skip
        assert r.hget(functions.key(ns, "unread"), 2) == "1"
        assert r.smembers(functions.key(ns, "following", 2)) == set()
        assert timeline(r, ns, 2) == [21]
        assert r.smembers(functions.key(ns, "erased")) == {"1"}
    assert compare_namespaces(redis.Redis.from_url(redis_url), *states, timeline_length=800)["ok"]


def test_each_task_of_a_worker_reuses_its_processor(redis_url, ns, monkeypatch):
    """Spark ships the ``mapInArrow`` function to every task by cloudpickle; two tasks in one Python
    worker must share one Processor (one Redis connection, one library check), not build one each."""
    import pickle

    import pyarrow as pa
    from pyspark import cloudpickle

    from pipelines.speed import stream

    cfg = ProcessorConfig(redis_url=redis_url, namespace=ns, record_freshness=False)
    shipped = cloudpickle.dumps(stream.apply_partitions(cfg))
    made = []
    init = Processor.__init__

    def counting(self, *a, **kw):
        made.append(self)
        init(self, *a, **kw)

    monkeypatch.setattr(Processor, "__init__", counting)
    monkeypatch.setattr(stream, "_PROCESSORS", {})  # this worker's cache, empty, restored at teardown
    for offset in (0, 1):  # two tasks: the function unpickled afresh each time, as Spark does
        task = pickle.loads(shipped)
        value = json.dumps(ev("user_registered", 1 + offset, offset, handle=f"h{offset}", display_name="x"))
        batch = pa.RecordBatch.from_pydict({"partition": [0], "offset": [offset], "value": [value.encode()]})
        (out,) = list(task(iter([batch])))
        assert out.column("applied").to_pylist() == [1]
    assert len(made) == 1


def test_state_of_an_older_key_layout_is_refused_with_the_rebuild_command(redis_url, ns):
    """Upgrading (docs/architecture.md): a namespace an older library wrote (a fence, no layout
    stamp: posts keyed by post id alone) is never read with the new key format; the processor's
    start and every apply refuse it with one line naming the command that rebuilds it."""
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    functions.check_layout(r, ns)  # an empty namespace is fine: the first apply stamps it
    r.hset(functions.key(ns, "fence"), "0", 5)  # as layout 1 left it
    with pytest.raises(
        functions.LayoutError, match=r"layout 1, this code writes layout 2.*pipelines\.rebuild run"
    ):
        functions.check_layout(r, ns)
    with pytest.raises(redis.ResponseError, match="LAYOUT.*pipelines.rebuild run"):
        apply(redis_url, ns, [[ev("status_updated", 1, 0, text="x")]])
    assert r.hget(functions.key(ns, "fence"), "0") == "5" and not r.exists(functions.key(ns, "status"))
    fresh = ns + "new"
    apply(redis_url, fresh, [[ev("status_updated", 1, 0, text="x")]])
    assert r.get(functions.key(fresh, "layout")) == functions.layout()
    functions.check_layout(r, fresh)


def test_state_of_the_other_serving_layout_is_refused_with_the_rebuild_command(redis_url, ns):
    """Switching SOCIAL_SERVING_LAYOUT never reads (or writes beside) a namespace the other layout
    built: the speed layer's start refuses it with one line naming the rebuild and the setting."""
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    apply(redis_url, ns, [[ev("status_updated", 1, 0, text="x")]])  # keyed state
    functions.check_layout(r, ns, "keyed")
    with pytest.raises(
        functions.LayoutError,
        match=r"keyed serving layout and SOCIAL_SERVING_LAYOUT=partitioned.*pipelines\.rebuild run.*"
        r"SOCIAL_SERVING_LAYOUT=keyed",
    ):
        functions.check_layout(r, ns, "partitioned")
    other = ns + "p"
    r.set(functions.pkey(other, 0, "layout"), "3")  # as a partitioned call stamps partition 0
    functions.check_layout(r, other, "partitioned")
    with pytest.raises(
        functions.LayoutError, match=r"partitioned serving layout and SOCIAL_SERVING_LAYOUT=keyed"
    ):
        functions.check_layout(r, other, "keyed")
    functions.check_layout(r, ns + "empty", "partitioned")  # an empty namespace is fine in either


def test_a_function_call_ends_at_the_posts_cap(redis_url, ns):
    """group_posts bounds what one call holds Redis for: a registration, 7 posts and 3 status
    updates of one user, at most 3 posts (and 200 events) per call: the registration and posts
    1-3, posts 4-6, post 7 and the statuses: three calls, and the timeline one call would give."""
    evs = [ev("user_registered", 2, 0, handle="bo", display_name="Bo")]
    evs += [ev("post_created", 2, 1 + i, post_id=100 + i, text="p") for i in range(7)]
    evs += [ev("status_updated", 2, 9 + i, text="s") for i in range(3)]
    records = [(o, raw) for _p, o, raw in to_records(evs)]
    got = Processor(ProcessorConfig(redis_url=redis_url, namespace=ns, group_posts=3)).process(
        2 % PARTITIONS, records
    )
    assert (got.fcalls, got.applied) == (3, 11)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    assert timeline(r, ns, 2) == [106, 105, 104, 103, 102, 101, 100]
