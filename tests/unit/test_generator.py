"""The generator, broker-free: graph shape, behaviour mix, clocks, contract, injection, determinism."""

from __future__ import annotations

from collections import Counter

import numpy as np
import orjson
import pytest

import contract
from app_sim import graph
from app_sim.generator import DEFAULT_MIX, DUPLICATE, INVALID_KINDS, EventGenerator, GeneratorConfig, generate

N = 60_000
CFG = GeneratorConfig(users=300, mean_followers=20, seed=11, invalid_share=0.01, duplicate_share=0.01)


@pytest.fixture(scope="module")
def run():
    gen = EventGenerator(N, CFG)
    records = list(gen.records())
    return gen, records


def test_graph_is_heavy_tailed_with_configured_mean():
    n = 3000
    edges = graph.follower_graph(n, 75, np.random.default_rng(1))
    assert abs(len(edges) / n - 75) < 75 * 0.1
    assert not (edges[:, 0] == edges[:, 1]).any()
    assert len(np.unique(edges[:, 0] * (n + 1) + edges[:, 1])) == len(edges)
    followers = np.sort(graph.followers_per_user(edges, n))[::-1]
    top1 = followers[: n // 100].sum() / followers.sum()
    assert top1 > 0.08  # uniform would be 1%
    assert np.median(followers) < followers.mean()
    assert followers.max() <= n - 1


def test_graph_mean_is_capped_by_users():
    edges = graph.follower_graph(10, 75, np.random.default_rng(1))
    assert len(edges) <= 10 * 9


def test_exact_count_and_accounting(run):
    gen, records = run
    c = gen.counts
    assert len(records) == c.records == N
    assert sum(c.per_type.values()) + sum(c.invalid.values()) + c.duplicates == N
    assert c.duplicates == round(CFG.duplicate_share * N)
    assert sum(c.invalid.values()) == round(CFG.invalid_share * N)
    assert set(c.invalid) == set(INVALID_KINDS.values())
    assert Counter(inj for _, _, inj in records if inj not in (None, DUPLICATE)) == Counter(c.invalid)
    assert c.per_type["user_registered"] == CFG.users


def _replay(records):
    """Replay the log in order with the speed layer's rules; yield (record, reason)."""
    posts: dict[int, int] = {}
    inbox: dict[int, int] = {}
    seen: set[str] = set()
    for key, value, injected in records:
        if isinstance(value, bytes):
            yield (key, value, injected), "bad_json"
            continue
        reason = contract.validate(value)
        if reason is None and value["event_id"] in seen:
            yield (key, value, injected), DUPLICATE
            continue
        if reason is None:
            t = value["type"]
            if t == "post_deleted" and posts.get(value["post_id"]) != value["user_id"]:
                reason = "not_own_post"
            elif t == "message_read" and inbox.get(value["message_id"]) != value["user_id"]:
                reason = "not_in_inbox"
        if reason is None:
            seen.add(value["event_id"])
            if value["type"] == "post_created":
                posts[value["post_id"]] = value["user_id"]
            elif value["type"] == "message_sent":
                inbox[value["message_id"]] = value["recipient_id"]
        yield (key, value, injected), reason


def test_every_record_gets_the_expected_outcome_in_log_order(run):
    _, records = run
    outcomes = Counter()
    for (key, value, injected), reason in _replay(records):
        assert reason == injected, (value, injected, reason)
        if injected is None:
            assert key == contract.record_key(value)
            assert orjson.loads(orjson.dumps(value)) == value
        outcomes[reason] += 1
    assert outcomes[None] == N - sum(v for k, v in outcomes.items() if k is not None)


def test_duplicates_are_exact_resends(run):
    _, records = run
    first: dict[str, tuple[bytes, bytes]] = {}
    for key, value, injected in records:
        if isinstance(value, bytes):
            continue
        raw = orjson.dumps(value)
        if injected == DUPLICATE:
            assert first[value["event_id"]] == (key, raw)
        elif injected is None:
            assert value["event_id"] not in first
            first[value["event_id"]] = (key, raw)


def test_keys_per_type(run):
    _, records = run
    for key, value, injected in records:
        if injected is None:
            field = "recipient_id" if value["type"] == "message_sent" else "user_id"
            assert key == str(value[field]).encode()


def test_behaviour_mix(run):
    gen, records = run
    activity = [v["type"] for _, v, inj in records if inj is None][CFG.users + gen.counts.follow_edges :]
    share = {t: n / len(activity) for t, n in Counter(activity).items()}
    for t in ("message_sent", "followed", "status_updated", "unfollowed", "post_deleted"):
        assert abs(share[t] - DEFAULT_MIX[t]) < 0.02, (t, share[t])
    assert share["post_created"] >= DEFAULT_MIX["post_created"] - 0.01  # fallbacks become posts
    assert max(share, key=share.get) == "post_created"
    assert 0.05 < share["message_read"] <= DEFAULT_MIX["message_read"] + 0.01


def test_messages_mostly_between_mutual_followers(run):
    _, records = run
    follows: set[tuple[int, int]] = set()
    mutual = total = 0
    for _, v, inj in records:
        if inj is not None:
            continue
        if v["type"] == "followed":
            follows.add((v["user_id"], v["followee_id"]))
        elif v["type"] == "unfollowed":
            follows.discard((v["user_id"], v["followee_id"]))
        elif v["type"] == "message_sent":
            total += 1
            a, b = v["user_id"], v["recipient_id"]
            mutual += (a, b) in follows and (b, a) in follows
    assert mutual / total > 0.6


def test_deletes_own_posts_and_reads_after_a_delay(run):
    _, records = run
    sent_at: dict[int, int] = {}
    delays = []
    for _, v, inj in records:
        if inj is not None:
            continue
        if v["type"] == "message_sent":
            sent_at[v["message_id"]] = v["received_time"]
        elif v["type"] == "message_read":
            delays.append(v["received_time"] - sent_at[v["message_id"]])
    delays = np.array(delays)
    assert len(delays) > 100
    assert (delays >= 0).all()
    assert 5_000 < np.median(delays) < 120_000  # configured median 30 s, minus unread tail


def test_clock_model(run):
    gen, records = run
    valid = [v for _, v, inj in records if inj is None]
    offsets = gen._offsets
    for v in valid:
        assert v["device_time"] <= v["sent_time"]
        # received = sent - device offset + network delay (5..150 ms)
        lag = v["received_time"] - (v["sent_time"] - offsets[v["user_id"]])
        assert 0 < lag < 1_000, v
    skew = np.abs(np.array(offsets[1:]))
    assert 5_000 < np.median(skew) < 40_000  # normal, sd 20 s
    assert (skew > 120_000).any()  # some devices minutes off


def test_offline_devices_flush_late(run):
    gen, records = run
    valid = [v for _, v, inj in records if inj is None]
    late = [v for v in valid if v["sent_time"] - v["device_time"] > 60_000]
    assert gen.counts.offline_buffered > 0
    assert len(late) >= 0.5 * gen.counts.offline_buffered
    # buffered events arrive after later events: log order differs from event time
    corrected = np.array([v["device_time"] + v["received_time"] - v["sent_time"] for v in valid])
    assert (np.diff(corrected) < -60_000).sum() > 10


def test_deterministic_from_seed():
    small = GeneratorConfig(users=50, mean_followers=5, seed=5, invalid_share=0.02, duplicate_share=0.02)
    a = [(k, orjson.dumps(v) if isinstance(v, dict) else v, i) for k, v, i in generate(5000, small)]
    b = [(k, orjson.dumps(v) if isinstance(v, dict) else v, i) for k, v, i in generate(5000, small)]
    c = [
        (k, orjson.dumps(v) if isinstance(v, dict) else v, i)
        for k, v, i in generate(
            5000,
            GeneratorConfig(users=50, mean_followers=5, seed=6, invalid_share=0.02, duplicate_share=0.02),
        )
    ]
    assert a == b
    assert a != c


def test_realtime_stamps_the_wall_clock():
    import time

    before = time.time_ns() // 1_000_000
    cfg = GeneratorConfig(users=20, mean_followers=3, seed=1, realtime=True, offline_share=0.0)
    out = [v for _, v, _ in generate(500, cfg)]
    after = time.time_ns() // 1_000_000
    assert all(before <= v["received_time"] <= after for v in out)


def test_too_few_events_for_the_bootstrap_is_a_clear_error():
    with pytest.raises(ValueError, match="bootstrap"):
        list(generate(100, GeneratorConfig(users=100, mean_followers=10)))


@pytest.mark.parametrize("pattern", ["burst", "follow_churn", "message_flood"])
def test_alert_patterns_are_valid_and_cross_their_thresholds(pattern):
    from app_sim.generator import pattern_events

    now = 1_767_225_600_000
    evs = pattern_events(
        pattern, user=3, now_ms=now, burst_posts=10, churn_repeats=3, churn_within_s=60, flood_recipients=20
    )
    assert all(contract.validate(e) is None for e in evs)
    assert {e["user_id"] for e in evs} == {3} and evs[-1]["received_time"] == now
    span_ms = evs[-1]["device_time"] - evs[0]["device_time"]
    if pattern == "burst":  # more than 10 posts (12), within half of a 10 s window (2.2 s)
        assert [e["type"] for e in evs] == ["post_created"] * 12 and span_ms == 2_200
    elif pattern == "follow_churn":  # 4 follows, each undone 1 s later, 4 different followees
        follows = [e for e in evs if e["type"] == "followed"]
        assert len(follows) == 4 and len({e["followee_id"] for e in follows}) == 4
        assert [e["type"] for e in evs] == ["followed", "unfollowed"] * 4 and span_ms == 7_000
    else:  # 22 distinct recipients (at least 20), none the sender, in 2.1 s
        assert len({e["recipient_id"] for e in evs}) == 22 and 3 not in {e["recipient_id"] for e in evs}
        assert span_ms == 2_100
