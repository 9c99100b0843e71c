"""The partitioned layout (docs/architecture.md, "The partitioned layout") through the real stream.

The generator's log in a real topic of 8 partitions, produced with the project's producer; the
speed layer's stream (Spark, the partitioned processor and its deliveries) catches it up with
``SOCIAL_SERVING_LAYOUT=partitioned`` and a fan-out threshold of 5 followers per partition (so
authors are fanned out in some partitions and merged at read time in others). Then every user's
views, read as the API reads them (``contract.serving.reader``: each user's partition from the
record key by librdkafka's partitioner), every record's disposition and the accounting must equal
the specification (:mod:`tests.spec.views`) evaluated over the same records read back from Kafka.
"""

from __future__ import annotations

import time

import pytest
import redis

from app_sim.generator import GeneratorConfig, produce
from contract.serving import partition_of
from infra import clients
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
    cfg = GeneratorConfig(users=300, seed=5, mean_followers=20, invalid_share=0.01, duplicate_share=0.01)
    summary = produce(12_000, cfg, topic=topic, bootstrap=kafka_stack.bootstrap, progress=False)
    assert summary.delivery_failures == 0
    ns = "partitioned"
    sl = speed_layer_factory(
        topic=topic,
        namespace=ns,
        archive=False,
        serving_layout="partitioned",
        fanout_threshold=5,
        max_offsets_per_trigger=3_000,  # several micro-batches: deliveries between them
    )
    sl.wait_caught_up(timeout=600)
    sl.stop()

    per_p = _records(settings, topic)
    # every valid record is in the partition librdkafka's partitioner gives its key
    for p, recs in per_p.items():
        for key, _ in recs:
            if key and key.isdigit():
                assert partition_of(int(key), 8) == p, (key, p)
    want = spec.evaluate(
        {p: [v for _, v in recs] for p, recs in per_p.items()},
        sl.settings.timeline_length,
        sl.settings.dedup_window_ms,
        sl.settings.dedup_grace_ms,
    )
    users = sorted({int(k) for recs in per_p.values() for k, _ in recs if k and k.isdigit()})
    got = harness.partitioned_views(settings.redis_url, ns, users, 50, lambda u: partition_of(u, 8))
    wanted = harness.spec_views(want, users)
    wanted["timeline"] = {u: t[:50] for u, t in wanted["timeline"].items()}
    problems = harness.diff_views(wanted, got)
    client = redis.Redis.from_url(settings.redis_url)
    problems += harness.diff_dispositions(
        want.dispositions, harness.partitioned_dispositions(client, ns, range(8))
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
