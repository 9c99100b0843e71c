"""Verify on a young stack whose log reuses one post id across authors (docs/views.md, "Identity").

A topic of four partitions of which only two hold records: the archive has seen no record of the
other two, which verify treats as position 0 (nothing to compare there) and says so, instead of
the Kafka source's stack trace it used to die with. The records are written by hand, with post
ids that two authors share, in the same partition and in different ones, and one author's delete
of the shared id: the whole verify (the Delta views and archive against the batch layer, Redis
against Delta, the keyed state against its replay, the accounting) must hold, and the API's read
of the follower's timeline must show both posts of the shared id.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from confluent_kafka import Producer

from pipelines.verify import summary
from tests.integration.verifying import run_verify

pytestmark = pytest.mark.integration

T0 = 1_767_225_600_000  # 2026-01-01
PARTITION = {1: 0, 3: 0, 2: 2, 4: 2}  # users 1 and 3 in partition 0, users 2 and 4 in partition 2


def _event(n: int, type_: str, user: int, **fields) -> dict:
    t = T0 + n * 1000
    return {
        "event_id": f"{user:08d}-0000-4000-8000-{n:012d}",
        "type": type_,
        "schema_version": 1,
        "user_id": user,
        "device_time": t,
        "sent_time": t,
        "received_time": t,
        **fields,
    }


def _log() -> list[dict]:
    events = [_event(0, "user_registered", u, handle=f"u{u}", display_name=f"U {u}") for u in (1, 2, 3, 4)]
    events += [
        _event(1, "followed", 4, followee_id=1),
        _event(2, "followed", 4, followee_id=3),
        _event(3, "followed", 1, followee_id=2),
        _event(4, "post_created", 1, post_id=77, text="one's 77"),
        _event(5, "post_created", 3, post_id=77, text="three's 77"),  # same id, same partition
        _event(6, "post_created", 2, post_id=77, text="two's 77"),  # same id, another partition
        _event(7, "post_deleted", 3, post_id=77),  # three's own: one's stays
        _event(8, "post_deleted", 4, post_id=77),  # four has no post 77: not_own_post
        _event(9, "post_created", 1, post_id=77, text="again"),  # one's id again: reused_id
    ]
    return events


def test_verify_a_young_stack_with_a_post_id_shared_by_authors(
    kafka_stack, topic_factory, speed_layer_factory
):
    topic = topic_factory(4)
    producer = Producer({"bootstrap.servers": kafka_stack.bootstrap, "enable.idempotence": True})
    events = _log()
    for e in events:
        producer.produce(
            topic, json.dumps(e).encode(), key=str(e["user_id"]).encode(), partition=PARTITION[e["user_id"]]
        )
    assert producer.flush(30) == 0
    # the keyed layout: the records go to partitions of the test's choosing, where the partitioned
    # layout's readers find a user in the partition librdkafka's partitioner gives its key
    sl = speed_layer_factory(topic=topic, namespace="young", serving_layout="keyed")
    sl.wait_caught_up(timeout=600)
    sl.stop()

    report = run_verify(sl.settings, topic, "young")
    assert report["position"]["at_zero"] == [1, 3]
    assert report["ok"], {k: v["mismatches"] for k, v in report["views"].items()}
    assert report["keyed"]["ok"] is True and report["batch_layer"]["ok"] is True
    assert report["serving"]["ok"] is True, report["serving"]
    a = report["accounting"]
    assert (a["events_read"], a["applied"], a["duplicates"], a["quarantined"]) == (
        len(events),
        len(events) - 2,
        0,
        2,
    )

    # what a user reads (the Redis function the API serves from): 4 follows 1 and 3; 1 follows 2
    from contract.serving import ServingStore, connect

    store = ServingStore(connect(kafka_stack.settings.redis_url), "young")
    tl = sorted(store.dump_timelines(kafka_stack.settings.timeline_length))
    assert tl == [(1, 1, 77), (1, 2, 77), (2, 2, 77), (4, 1, 77)]  # (user, author, post)
    fence, bodies = store.r.fcall_ro("social_timeline", 0, "young", 1, 10)
    assert [(b["author_id"], b["text"]) for b in map(json.loads, bodies)] == [
        (2, "two's 77"),
        (1, "one's 77"),
    ]

    # what verify prints names the partitions at position 0
    assert "partitions [1, 3] have nothing archived yet: position 0" in summary(report)


def test_verify_reads_the_archive_at_the_views_position_while_the_archive_runs_ahead(
    kafka_stack, topic_factory, speed_layer_factory
):
    """The archiver appends ``events_bronze`` and ``quarantine`` ahead of the compaction: verify
    reads them at the compacted views' position P, as it recomputes them, so a scheduled verify
    under live traffic raises no false alarm. P first covers partition 0 alone (the compaction is
    ahead of partitions with no records); then partition 2 gets records that are archived, not
    compacted; once compacted, verify covers them."""
    from contract import functions
    from pipelines.archiver import archive_once, cutter
    from pipelines.compaction import compact_once
    from pipelines.lake import Lake
    from tests.integration.verifying import worker_spark

    # the keyed layout: the records go to partitions of the test's choosing (as in the test above)
    settings, ns = dataclasses.replace(kafka_stack.settings, serving_layout="keyed"), "ahead"
    topic = topic_factory(4)
    producer = Producer({"bootstrap.servers": kafka_stack.bootstrap, "enable.idempotence": True})

    def send(events: list[dict], bad_in: int) -> None:
        for e in events:
            producer.produce(
                topic,
                json.dumps(e).encode(),
                key=str(e["user_id"]).encode(),
                partition=PARTITION[e["user_id"]],
            )
        producer.produce(topic, b"{not json", key=b"0", partition=bad_in)  # quarantined
        assert producer.flush(30) == 0

    first = [_event(0, "user_registered", u, handle=f"u{u}", display_name=f"U {u}") for u in (1, 3)]
    first += [_event(1, "followed", 3, followee_id=1), _event(2, "post_created", 1, post_id=5, text="a")]
    send(first, bad_in=0)
    sl = speed_layer_factory(topic=topic, namespace=ns, archive=False, serving_layout="keyed")
    sl.wait_caught_up(timeout=600)

    spark = worker_spark(settings)
    client = functions.connect(settings.redis_url)
    archiver = Lake(spark, settings.lake_dir, ns, writer="archiver")
    archiver.ensure_tables()
    compactor = Lake(spark, settings.lake_dir, ns, writer="compaction")

    cut = cutter(sl.settings, client, ns, topic)  # the serving layout's consistent cut

    def archive() -> None:
        assert archive_once(spark, archiver, client, settings, topic, cut()) is not None

    archive()
    assert compact_once(spark, compactor, settings) is not None

    second = [_event(3, "user_registered", u, handle=f"u{u}", display_name=f"U {u}") for u in (2, 4)]
    second += [
        _event(4, "post_created", 2, post_id=6, text="b"),
        _event(5, "post_created", 1, post_id=7, text="c"),
    ]
    send(second, bad_in=2)
    sl.wait_caught_up(timeout=600)
    archive()  # archived, not compacted: the archive is ahead of the views

    report = run_verify(settings, topic, ns)
    assert report["position"]["end_offsets"] == {"0": len(first) + 1}
    assert report["position"]["at_zero"] == [1, 2, 3]
    for name in ("events_bronze", "quarantine"):
        v = report["views"][name]
        assert v["mismatches"] == 0 and v["live_rows"] == v["recomputed_rows"], (name, v)
    assert report["views"]["events_bronze"]["live_rows"] == len(first)
    assert report["views"]["quarantine"]["live_rows"] == 1
    assert report["ok"], {k: v["mismatches"] for k, v in report["views"].items()}

    assert compact_once(spark, compactor, settings) is not None
    report = run_verify(settings, topic, ns)
    assert report["position"]["at_zero"] == [1, 3]
    assert report["views"]["events_bronze"]["live_rows"] == len(first) + len(second)
    assert report["views"]["quarantine"]["live_rows"] == 2
    assert report["ok"], {k: v["mismatches"] for k, v in report["views"].items()}
    assert report["serving"]["ok"] is True, report["serving"]
    sl.stop()
