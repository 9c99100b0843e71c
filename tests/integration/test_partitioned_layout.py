"""The partitioned layout (docs/architecture.md, "The partitioned layout") through the real stream.

The generator's log in a real topic of 8 partitions, produced with the project's producer; the
speed layer's stream (Spark, the partitioned processor and its deliveries) catches it up with
``SOCIAL_SERVING_LAYOUT=partitioned`` and a fan-out threshold of 5 followers per partition (so
authors are fanned out in some partitions and merged at read time in others). Then every user's
views, read as the API reads them (``contract.serving.reader``: each user's partition from the
record key by librdkafka's partitioner), every record's disposition and the accounting must equal
the specification (:mod:`tests.spec.views`) evaluated over the same records read back from Kafka.

The archiver runs beside it, archiving every few seconds while the stream reads on (each archive at
the newest position every partition marked, :class:`pipelines.speed.changelog.SettledCuts`), and
compacts at the end: the Delta views must equal the specification's facts too, and ``verify`` must pass,
its replay comparison also while the stream is applying (in a frozen copy of the live Redis).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from app_sim.generator import GeneratorConfig, produce
from contract import functions
from contract.serving import partition_of
from infra import clients
from tests.integration.verifying import assert_verified, run_verify, verify_keyed, worker_spark
from tests.spec import harness
from tests.spec import views as spec

pytestmark = pytest.mark.integration


def _records(settings, topic: str) -> dict[int, list[tuple[bytes, bytes | None]]]:
    """Every record of the topic per partition, in offset order: (key, value)."""
    from confluent_kafka import TopicPartition

    from infra.stack import end_offsets

    ends = end_offsets(settings, topic)
    c = clients.kafka_consumer(settings, "partitioned-layout-test")
    out: dict[int, list] = {p: [] for p in ends}
    try:
        c.assign([TopicPartition(topic, p, 0) for p in ends])
        deadline = time.monotonic() + 60
        while sum(map(len, out.values())) < sum(ends.values()) and time.monotonic() < deadline:
            for msg in c.consume(2000, timeout=0.5):
                if msg.error() is None:
                    out[msg.partition()].append((msg.offset(), msg.key(), msg.value()))
    finally:
        c.close()
    assert sum(map(len, out.values())) == sum(ends.values())
    return {p: [(k, v) for _, k, v in sorted(rs)] for p, rs in out.items()}


def test_stream_in_the_partitioned_layout_equals_the_specification(
    kafka_stack, topic_factory, speed_layer_factory
):
    settings = kafka_stack.settings
    topic = topic_factory(8)
    ns = "partitioned"
    sl = speed_layer_factory(
        topic=topic,
        namespace=ns,
        serving_layout="partitioned",
        archive_interval_s=2.0,  # archives at cuts taken while deliveries are still under way
        fanout_threshold=5,
        max_offsets_per_trigger=1_500,  # several micro-batches: deliveries between them
    )
    sl.wait_running()
    _wait_line(sl.archiver_log, b"archiver running")
    cfg = GeneratorConfig(users=300, seed=5, mean_followers=20, invalid_share=0.01, duplicate_share=0.01)
    worker_spark(sl.settings)  # verify's Spark session, started before the records flow
    # paced, so the archiver cuts several archives while the stream reads on, and verify's copy is
    # taken while records still arrive: at 1,000/s a loaded machine's verify took its copy after the
    # last one (2 of 3 runs beside test_external_lake.py, 2026-12-06); at 300/s they arrive for 40 s,
    # and verify starts once 7,000 are applied (past the 6,300 of the users and the follow graph:
    # timelines exist), 17 s before the last is produced
    with ThreadPoolExecutor(1) as pool:
        producing = pool.submit(
            produce, 12_000, cfg, topic=topic, bootstrap=kafka_stack.bootstrap, rate=300, progress=False
        )
        # verify's replay comparison while the stream applies and delivers: made in a frozen copy
        # of the live Redis (completed by its outboxes' deliveries), never "skipped" for a moving state
        client = redis.Redis.from_url(settings.redis_url)
        deadline = time.monotonic() + 300
        while sum(functions.layout_fences(client, ns, "partitioned", 8, whole=False).values()) < 7_000:
            assert time.monotonic() < deadline, "the stream applied under 7,000 records in 5 minutes"
            time.sleep(0.2)
        live = verify_keyed(sl.settings, topic, ns)
        summary = producing.result()
    assert live["ok"] is True, {n: f for n, f in live.get("families", {}).items() if not f["ok"]} or live
    assert live["compared_in"].startswith("a frozen copy"), live["compared_in"]
    # taken mid-stream (1,500 records a micro-batch at most: the stream was still reading on)
    assert 7_000 <= sum(live["position"].values()) < 12_000, live["position"]
    assert live["families"]["tl"]["keys"] > 100
    assert summary.delivery_failures == 0
    sl.wait_caught_up(timeout=600)
    sl.stop()

    per_p = _records(settings, topic)
    # every valid record is in the partition librdkafka's partitioner gives its key
    for p, recs in per_p.items():
        for key, _ in recs:
            if key and key.isdigit():
                assert partition_of(int(key), 8) == p, (key, p)
    want = harness.expected_under(sl.settings, {p: [v for _, v in recs] for p, recs in per_p.items()})
    users = sorted({int(k) for recs in per_p.values() for k, _ in recs if k and k.isdigit()})
    got = harness.partitioned_views(settings.redis_url, ns, users, 50, lambda u: partition_of(u, 8))
    wanted = harness.spec_views(want, users)
    wanted["timeline"] = {u: t[:50] for u, t in wanted["timeline"].items()}
    problems = harness.diff_views(wanted, got)
    client = redis.Redis.from_url(settings.redis_url)
    # every record's disposition, from its changelog entry: archived to Delta (and trimmed from
    # Redis) or still in Redis's tail
    archived = {
        (r["partition"], r["offset"]): (harness.DISPOSITION[r["disposition"]], r["reason"] or None)
        for r in _table(settings, ns, "changelog")
        if r["disposition"] != "x"
    }
    problems += harness.diff_dispositions(
        want.dispositions, archived | harness.partitioned_dispositions(client, ns, range(8))
    )
    problems += harness.diff_accounting(
        want.accounting(), harness.partitioned_accounting(client, ns, range(8))
    )
    assert not problems, "\n".join(problems[:20])
    # the fan-out happened, on write and at read time, and nothing waits in an outbox
    assert sum(len(t) for t in got["timeline"].values()) > 1_000
    assert any(client.scard(f"{ns}:{{{p}}}:celebs") for p in range(8))
    assert all(client.xlen(f"{ns}:{{{p}}}:out") == 0 for p in range(8))
    assert all(client.xlen(f"{ns}:{{{p}}}:dlq") == 0 for p in range(8))

    # the archive, cut while the stream read on, and the views compacted from it
    archives = _table(settings, ns, "archives")
    assert len(archives) >= 2, f"the archiver cut {len(archives)} archive(s); want several mid-stream"
    assert sum(a["records"] for a in archives) == sum(len(r) for r in per_p.values())
    assert _delta_facts(settings, ns) == _spec_facts(want)
    # ... and what is archived leaves Redis: each partition keeps only its changelog's tail
    tail = sum(client.xlen(f"{ns}:{{{p}}}:changelog") for p in range(8))
    assert tail < sum(len(r) for r in per_p.values()) / 2, f"{tail} changelog entries left in Redis"

    # and verify, as `python -m pipelines.verify` runs it in this layout: the Delta views against
    # the batch layer, Redis against the Delta views, and Redis against the log replayed into a
    # scratch namespace by the same processor and deliveries, key by key
    report = run_verify(sl.settings, topic, ns)
    assert_verified(report, summary)
    # ... and Redis against the batch layer directly, every view (timelines as users read them)
    batch = report["batch_layer"]
    assert batch["ok"] is True, {
        v: r["examples"] for v, r in batch.get("views", {}).items() if not r["ok"]
    } or batch
    assert (
        batch["views"]["home_timeline"]["batch_rows"] > 1_000 and batch["views"]["celebrities"]["batch_rows"]
    )

    # restore after FLUSHALL (`python -m pipelines.restore`, here in this worker's Spark session):
    # the namespace's keys copied aside, dropped, written again from its Delta views at P (the log's
    # end here), then equal to the copy key by key as verify compares (timelines: their first N)
    from pipelines.restore import restore
    from pipelines.speed.compare import compare_namespaces

    for key in client.scan_iter(match=f"{ns}:*", count=2000):
        client.copy(key, b"before" + key[len(ns) :])
    functions.drop_namespace(client, ns)
    report = restore(worker_spark(sl.settings), sl.settings, ns)
    assert report["position"] == {str(p): len(recs) for p, recs in per_p.items()}
    same = compare_namespaces(client, ns, "before", sl.settings.timeline_length)
    assert same["ok"], {n: f for n, f in same["families"].items() if not f["ok"]}
    assert same["families"]["tl"]["keys"] > 100 and same["families"]["ap"]["keys"] > 100


def _wait_line(path, line: bytes, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and line in path.read_bytes()):
        assert time.monotonic() < deadline, f"no {line!r} in {path}"
        time.sleep(0.5)


def _table(settings, ns: str, name: str) -> list[dict]:
    """A Delta table's rows, read by Spark (the views carry deletion vectors, which delta-rs 1.6
    does not read)."""
    from pipelines.lake import Lake
    from tests.integration.verifying import worker_spark

    return [r.asDict() for r in Lake(worker_spark(settings), settings.lake_dir, ns).read(name).collect()]


def _delta_facts(settings, ns: str) -> dict:
    """The Delta views as the specification's facts (users, status, follows, posts, inbox, unread)."""
    t = {name: _table(settings, ns, name) for name in ("users", "user_status", "follows", "posts", "inbox")}
    unread = {r["user_id"]: r["unread"] for r in _table(settings, ns, "unread_counts") if r["unread"]}
    return {
        "users": {
            r["user_id"]: {"handle": r["handle"], "display_name": r["display_name"]} for r in t["users"]
        },
        "status": {
            r["user_id"]: {"text": r["text"], "event_time": r["event_time"]} for r in t["user_status"]
        },
        "follows": {(r["user_id"], r["followee_id"]) for r in t["follows"]},
        "posts": {
            (r["author_id"], r["post_id"]): {
                "text": r["text"],
                "event_time": r["event_time"],
                "deleted": r["deleted"],
            }
            for r in t["posts"]
        },
        "inbox": {
            (r["recipient_id"], r["message_id"]): {
                "message_id": r["message_id"],
                "sender_id": r["sender_id"],
                "text": r["text"],
                "event_time": r["event_time"],
                "read": r["read"],
            }
            for r in t["inbox"]
        },  # fmt: skip
        "unread": unread,
    }


def _spec_facts(out: spec.Outcome) -> dict:
    return {
        "users": out.users,
        "status": out.status,
        "follows": {(u, f) for u, fs in out.follows.items() for f in fs},
        "posts": out.posts,
        "inbox": {(r, m): body for r, box in out.inbox.items() for m, body in box.items()},
        "unread": {r: n for r in out.inbox if (n := out.unread(r))},
    }
