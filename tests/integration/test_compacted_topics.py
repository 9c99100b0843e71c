"""The compacted topics against the real stack: Kafka -> speed layer -> Redis -> compacted topics.

A small hand-worked log goes through the running speed layer; a fresh consumer reads the two
compacted topics from offset 0 (never the event topic) and must find the follow graph and the
profiles worked out by hand from docs/views.md, equal to Redis's views too (``social-bootstrap``
says ``equal``). Then Kafka's cleaner must really have compacted them: with small
``segment.ms``/``min.cleanable.dirty.ratio``/``delete.retention.ms`` for these topics, superseded
values and the unfollow tombstones disappear from the topics within a bounded wait, while the
state read from them stays the same. (The erasure's tombstones are unit-tested on the publisher's
records: tests/unit/test_compacted.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.unit.events import T0, ev

pytestmark = pytest.mark.integration

COMPACTED_TEST_SETTINGS = {
    "compacted_partitions": 1,  # one partition: every roll below rolls the whole topic
    "compacted_segment_ms": 1000,
    "compacted_min_cleanable_dirty_ratio": 0.01,
    "compacted_delete_retention_ms": 2000,
}


# the hand-worked log (t = device time in seconds; clocks in sync): follows 1->2, 1->3 then
# unfollowed, 2->1, 3->1, 2->3; statuses of 1 (twice) and 2
HAND_LOG = [
    ev("user_registered", 1, 0, handle="ann", display_name="Ann"),
    ev("user_registered", 2, 1, handle="bob", display_name="Bob"),
    ev("user_registered", 3, 2, handle="cy", display_name="Cy"),
    ev("followed", 1, 3, followee_id=2),
    ev("followed", 1, 4, followee_id=3),
    ev("followed", 2, 5, followee_id=1),
    ev("followed", 3, 6, followee_id=1),
    ev("unfollowed", 1, 7, followee_id=3),
    ev("status_updated", 1, 8, text="first"),
    ev("status_updated", 1, 9, text="second"),
    ev("status_updated", 2, 10, text="bob here"),
    ev("followed", 2, 11, followee_id=3),
]


def _send(bootstrap: str, topic: str, events: list[dict]) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for e in events:
        p.produce(topic, key=str(e["user_id"]).encode(), value=json.dumps(e).encode())
    assert p.flush(30) == 0


def _keys(settings, topic: str) -> list[bytes | None]:
    """Every record's key in the topic, in offset order (one partition), with None for tombstones'
    keys marked by a trailing '=null'."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer(
        {"bootstrap.servers": settings.kafka_bootstrap, "group.id": "t", "enable.auto.commit": False}
    )
    try:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        out = []
        if hi == 0:
            return out
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error() is not None:
                continue
            out.append(m.key() + (b"=null" if m.value() is None else b""))
            if m.offset() + 1 >= hi:
                return out
        raise AssertionError(f"{topic}: could not read to {hi}")
    finally:
        c.close()


def test_bootstrap_from_compacted_topics_equals_the_views(kafka_stack, topic_factory, speed_layer_factory):
    from infra.stack import delete_topic, settings_env
    from pipelines import bootstrap
    from pipelines.speed import compacted

    topic = topic_factory(4)
    ns = "ct" + topic[-8:]
    sl = speed_layer_factory(topic, ns, archive=False, **COMPACTED_TEST_SETTINGS)
    settings = sl.settings
    names = compacted.topic_names(topic, ns)
    client = __import__("redis").Redis.from_url(settings.redis_url)
    try:
        _send(settings.kafka_bootstrap, topic, HAND_LOG)
        sl.wait_caught_up(timeout=300)
        assert bootstrap.wait_published(client, ns, 60), "the publisher did not catch up"
        state, read = bootstrap.from_topics(settings, topic, ns)
        # follows: 1->2, 1->3 then unfollowed, 2->1, 3->1, 2->3
        assert state.follows == {(1, 2), (2, 1), (3, 1), (2, 3)}
        assert state.profiles == {
            1: {"handle": "ann", "display_name": "Ann", "status": "second", "status_time": T0 + 9000},
            2: {"handle": "bob", "display_name": "Bob", "status": "bob here", "status_time": T0 + 10_000},
            3: {"handle": "cy", "display_name": "Cy", "status": None, "status_time": None},
        }
        assert read["follows_tombstones"] >= 1  # 1:3's unfollow
        assert bootstrap.differences(state, bootstrap.from_redis(client, ns)) == []

        # superseded values: 1 unfollows 2 (a tombstone after a value), 1's status changes again
        _send(
            settings.kafka_bootstrap,
            topic,
            [ev("unfollowed", 1, 12, followee_id=2), ev("status_updated", 1, 13, text="third")],
        )
        sl.wait_caught_up(timeout=120)
        assert bootstrap.wait_published(client, ns, 60)
        follows_before = _keys(settings, names.follows)
        profiles_before = _keys(settings, names.profiles)
        assert follows_before.count(b"1:2") == 1 and b"1:2=null" in follows_before
        assert b"1:3=null" in follows_before
        assert profiles_before.count(b"1") >= 2

        # Kafka's cleaner: each round rolls the segments (a record after segment.ms) with a change
        # that leaves the graph as it is (3 follows 2 again) and one more status of 2; superseded
        # values go at the first cleaning, tombstones at one after delete.retention.ms.
        deadline = time.monotonic() + 150
        t = 14
        while True:
            time.sleep(2.5)
            _send(
                settings.kafka_bootstrap,
                topic,
                [ev("followed", 3, t, followee_id=2), ev("status_updated", 2, t, text=f"roll {t}")],
            )
            t += 1
            sl.wait_caught_up(timeout=60)
            assert bootstrap.wait_published(client, ns, 60)
            follows_now = _keys(settings, names.follows)
            profiles_now = _keys(settings, names.profiles)
            gone = not any(k.startswith((b"1:2", b"1:3")) for k in follows_now)
            if gone and profiles_now.count(b"1") == 1:
                break
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not compacted after 150 s: follows {follows_now}, profiles {profiles_now}"
                )
        # the unfollowed edges and the superseded profile of 1 gone (fewer records than were
        # produced), and the state read from the topics unchanged
        assert len(follows_now) < len(follows_before) + (t - 14)
        state, _ = bootstrap.from_topics(settings, topic, ns)
        assert state.follows == {(2, 1), (3, 1), (2, 3), (3, 2)}
        assert state.profiles[1]["status"] == "third"
        assert state.profiles[2]["status"] == f"roll {t - 1}"
        assert bootstrap.differences(state, bootstrap.from_redis(client, ns)) == []

        # the CLI, as a user runs it
        done = subprocess.run(
            [sys.executable, "-m", "pipelines.bootstrap", "--topic", topic, "--namespace", ns],
            env=settings_env(settings),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0 and done.stdout.strip().endswith("equal"), done.stdout + done.stderr
        assert "bootstrapped 3 profiles and 4 follow edges" in done.stdout
    finally:
        sl.stop()
        for name in (names.profiles, names.follows):
            try:
                delete_topic(settings, name)
            except Exception:  # noqa: BLE001 - cleanup must not mask the outcome
                pass


def test_the_partitioned_layout_publishes_the_same_topics(kafka_stack, topic_factory, speed_layer_factory):
    """The partitioned layout: each partition's changelog up to the newest settled cut, an
    erasure's follow removals published from the partitions of the erased user's followers (its
    deliveries there); the topics alone give the state worked out by hand, equal to Redis's."""
    from pipelines import bootstrap

    topic = topic_factory(4)
    ns = "pct" + topic[-8:]
    # one partition, but no cleaning: the tombstones counted below must still be in the topics
    # however long the four partitions take to publish (the cleaning is the keyed test's part)
    sl = speed_layer_factory(topic, ns, archive=False, serving_layout="partitioned", compacted_partitions=1)
    settings = sl.settings
    client = __import__("redis").Redis.from_url(settings.redis_url)
    # the erasure after the hand log is applied: 2's follow of 3 (another partition) is then in
    # 2's partition before 3 is erased, so its removal is a delivery there. (Sent together, 2's
    # partition may apply the follow after the erasure, as a follow of nobody: no edge to publish.)
    _send(settings.kafka_bootstrap, topic, HAND_LOG)
    sl.wait_caught_up(timeout=300)
    _send(
        settings.kafka_bootstrap,
        topic,
        [
            ev("status_updated", 3, 12, text="cy's"),
            ev("user_erased", 3, 13),  # 3's edges both ways go, and its profile
        ],
    )
    sl.wait_caught_up(timeout=300)
    assert bootstrap.wait_published(client, ns, 60, partitions=4), "the publisher did not catch up"
    state, read = bootstrap.from_topics(settings, topic, ns)
    assert state.follows == {(1, 2), (2, 1)}
    assert state.profiles == {
        1: {"handle": "ann", "display_name": "Ann", "status": "second", "status_time": T0 + 9000},
        2: {"handle": "bob", "display_name": "Bob", "status": "bob here", "status_time": T0 + 10_000},
    }
    assert read["profiles_tombstones"] >= 1 and read["follows_tombstones"] >= 3  # 1:3, 3:1, 2:3
    assert bootstrap.differences(state, bootstrap.from_redis(client, ns, partitions=4)) == []
