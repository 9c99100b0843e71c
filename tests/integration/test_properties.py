"""Property-based differential test, Spark part: (b) the replay and (c) the batch layer against
(d) the specification, over generated hostile logs in a real Kafka topic.

Spark's fixed cost is paid once per batch of examples: each Hypothesis example here is a batch
of ``SOCIAL_PROPERTY_BATCH`` logs (:mod:`tests.spec.logs`), each relabelled into its own id
space (users, posts, messages, event ids) and its own Kafka partitions (log k uses partitions
4k..4k+3 of one topic), so nothing one log does can reach another: dedup memory, erasure,
accounting and every rule in both implementations are per partition or per user. Per batch:

- (b) :func:`pipelines.replay.replay_keyed` runs the speed layer's processor over the topic in
  Spark into a scratch Redis namespace; every log's views are read as users read them (the
  ``social_timeline`` merge, inbox with read states, unread, status, follows, users), with
  every record's disposition and the accounting of its partitions;
- (c) the batch layer's :func:`pipelines.batch_layer.definition.compute` over the same records
  (parsed from the topic by :func:`pipelines.parse.parse_records`, as the archive holds them):
  its tables collected, the users' read built from ``home_timeline`` (the fanned-out part) and
  the live posts of the ``celebrities`` a user follows, newest first, the first N;

and each log's result must equal the specification's (:mod:`tests.spec.views`). The grammar
leaves out one class here: a record received more than the dedup grace behind its partition's
newest, where the batch layer (which never forgets an id) differs from the speed layer by design
(docs/architecture.md, "The batch layer"); tests/unit/test_properties.py covers it for (a).

``SOCIAL_PROPERTY_BATCHES`` batches (CI: 4) of ``SOCIAL_PROPERTY_BATCH`` logs (CI: 60), each
batch drawn by Hypothesis with the seed ``SOCIAL_PROPERTY_SEED`` + its number (random unless
set; a failure names it, and the failing logs as Python literals); ``make test-properties`` runs
more. A batch is not shrunk (each try would be a Spark job): a failing log goes into
tests/unit/test_properties.py as a named test, where (a) runs it in milliseconds.
"""

from __future__ import annotations

import dataclasses
import os
import random
import uuid
from collections import defaultdict

import hypothesis
import pytest
import redis
from hypothesis import HealthCheck, Phase, given, settings

from tests.spec import harness
from tests.spec.logs import GRACE_MS, REORDER, WINDOW_MS, Log, logs

pytestmark = pytest.mark.integration

BATCHES = int(os.environ.get("SOCIAL_PROPERTY_BATCHES", "4"))
BATCH = int(os.environ.get("SOCIAL_PROPERTY_BATCH", "60"))
STRIDE = 4  # Kafka partitions per log (logs draw 2-4)
# The seed of the first batch (batch i uses SEED + i): random unless given, printed on a failure.
SEED = int(os.environ.get("SOCIAL_PROPERTY_SEED") or random.randrange(2**31))


def produce(bootstrap: str, topic: str, batch: list[Log]) -> dict[int, int]:
    """Every record to its partition with its key, in order; returns the end offsets."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    errors: list = []
    ends: dict[int, int] = defaultdict(int)
    for log in batch:
        for r in log.records:
            producer.produce(
                topic,
                value=r.raw(),
                key=r.key.encode(),
                partition=r.partition,
                on_delivery=lambda err, _msg: errors.append(err) if err else None,
            )
            ends[r.partition] += 1
        producer.poll(0)
    assert producer.flush(60) == 0 and not errors, errors
    return {p: ends.get(p, 0) for p in range(STRIDE * len(batch))}


# The batch layer's input folded to STRIDE partitions: log k's partition 4k + q becomes q, its
# offsets moved up by k * FOLD. Its rules are per partition and per user, no two logs share a user,
# a post, a message, an event_id or a writer, and log k is received after log k - 1
# (Log.relabel), so folding changes no decision; but its filter of the
# log position (one term per partition) over 4 * BATCH partitions made plans so large that three
# batches in one session ran its driver out of heap (catalyst expressions, 2026-11-28).
FOLD = 1_000_000
ACCOUNTING_OF = {
    "applied": "applied",
    "duplicate": "duplicates",
    "rejected": "rejected",
    "quarantined": "quarantined",
}


def fold(df):
    from pyspark.sql import functions as F

    k = F.floor(F.col("partition") / STRIDE).cast("bigint")
    return df.withColumn("offset", F.col("offset") + k * FOLD).withColumn(
        "partition", (F.col("partition") % STRIDE).cast("int")
    )


def folded_position(logs_in_batch: int) -> dict[int, int]:
    return {q: logs_in_batch * FOLD for q in range(STRIDE)}


def unfold(partition: int, offset: int) -> tuple[int, int]:
    return (offset // FOLD) * STRIDE + partition, offset % FOLD


def batch_views(views, n: int) -> dict:
    """The batch layer's tables as users read them: per user, the same shape as the spec's."""
    t = {name: [r.asDict() for r in df.collect()] for name, df in views.tables().items()}
    posts = {(r["author_id"], r["post_id"]): r for r in t["posts"]}
    celebs = {r["author_id"] for r in t["celebrities"]}
    follows: dict[int, set[int]] = defaultdict(set)
    for r in t["follows"]:
        follows[r["user_id"]].add(r["followee_id"])
    stored: dict[int, list] = defaultdict(list)
    for r in t["home_timeline"]:
        stored[r["user_id"]].append((r["author_id"], r["post_id"]))
    merged_src: dict[int, list] = defaultdict(list)
    for (a, p), r in posts.items():
        if a in celebs and not r["deleted"]:
            merged_src[a].append((a, p))

    def timeline(u):
        keys = stored.get(u, []) + [k for c in follows.get(u, set()) & celebs for k in merged_src[c]]
        bodies = [
            {
                "post_id": p,
                "author_id": a,
                "text": posts[a, p]["text"],
                "event_time": posts[a, p]["event_time"],
            }
            for a, p in keys
        ]
        bodies.sort(key=lambda b: (b["event_time"], b["post_id"], b["author_id"]), reverse=True)
        return bodies[:n]

    inbox: dict[int, dict] = defaultdict(dict)
    for r in t["inbox"]:
        inbox[r["recipient_id"]][r["message_id"]] = {
            k: r[k] for k in ("message_id", "sender_id", "text", "event_time", "read")
        }
    return {
        "timeline": timeline,
        "inbox": inbox,
        "unread": {r["user_id"]: r["unread"] for r in t["unread_counts"]},
        "status": {
            r["user_id"]: {"text": r["text"], "event_time": r["event_time"]} for r in t["user_status"]
        },
        "follows": follows,
        "users": {
            r["user_id"]: {"handle": r["handle"], "display_name": r["display_name"]} for r in t["users"]
        },
        "dispositions": {
            unfold(r["partition"], r["offset"]): (r["disposition"], r["reason"]) for r in t["dispositions"]
        },
        "accounting": {r["partition"]: r for r in t["accounting"]},
    }


def batch_views_of(b: dict, users: list[int]) -> dict:
    return {
        "timeline": {u: b["timeline"](u) for u in users},
        "inbox": {u: b["inbox"].get(u, {}) for u in users},
        "unread": {u: b["unread"].get(u, 0) for u in users},
        "status": {u: b["status"].get(u) for u in users},
        "follows": {u: set(b["follows"].get(u, set())) for u in users},
        "users": {u: b["users"].get(u) for u in users},
    }


def run_batch(spark, stack_settings, topic: str, batch: list[Log], n: int, t: int, group: int) -> list[str]:
    from contract import functions
    from pipelines.batch_layer.definition import BatchConfig, compute
    from pipelines.batch_layer.job import computed_once
    from pipelines.parse import parse_records
    from pipelines.replay import read_log, replay_keyed

    # the keyed layout: these logs put their users in partitions of their own choosing, where the
    # partitioned layout's readers find a user in the partition librdkafka's partitioner gives its
    # key (the partitioned layout is held to the specification by tests/unit/test_properties.py
    # and tests/integration/test_partitioned_layout.py)
    settings = dataclasses.replace(
        stack_settings,
        timeline_length=n,
        fanout_threshold=t,
        processor_group_size=group,
        serving_layout="keyed",
        dedup_window_ms=WINDOW_MS,
        dedup_grace_ms=GRACE_MS,
        dedup_reorder=REORDER,
    )
    ends = produce(settings.kafka_bootstrap, topic, batch)
    ns = f"props{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(settings.redis_url)
    problems: list[str] = []
    totals = dict.fromkeys(harness.ACCOUNTING, 0)
    try:
        counts = replay_keyed(spark, settings, topic, ends, ns)
        assert counts["records"] == sum(ends.values()), counts

        # one task per core, not one per Kafka partition (4 per log): the parse and the batch
        # layer then cost what the records cost, not what the partitions do
        records = read_log(spark, settings, topic, ends).coalesce(spark.sparkContext.defaultParallelism)
        events, quarantine = parse_records(records)
        cfg = BatchConfig(n, t, settings.dedup_window_ms, settings.dedup_grace_ms, settings.dedup_reorder)
        # the intermediates several views share computed once, as the batch layer's job does
        views = compute(fold(events), fold(quarantine), folded_position(len(batch)), cfg, keep=computed_once)
        bv = batch_views(views, n)
        for k, log in enumerate(batch):
            want = harness.expected(log, n)
            want_views = harness.spec_views(want, log.users)
            parts = sorted({r.partition for r in log.records})
            label = f"log {k} (b) replay: "
            got = harness.redis_views(settings.redis_url, ns, log.users, n)
            found = harness.diff_views(want_views, got, label)
            found += harness.diff_dispositions(
                want.dispositions, harness.redis_dispositions(client, ns, parts), label
            )
            found += harness.diff_accounting(
                want.accounting(), harness.redis_accounting(client, ns, parts), label
            )
            label = f"log {k} (c) batch layer: "
            found += harness.diff_views(want_views, batch_views_of(bv, log.users), label)
            got_d = {pk: d for pk, d in bv["dispositions"].items() if pk[0] in parts}
            found += harness.diff_dispositions(want.dispositions, got_d, label)
            acc = dict.fromkeys(harness.ACCOUNTING, 0)
            for d, _reason in got_d.values():
                acc[ACCOUNTING_OF[d]] += 1
            found += harness.diff_accounting(want.accounting(), acc, label)
            for name in harness.ACCOUNTING:
                totals[name] += want.accounting()[name]
            if found:
                problems += [f"N={n} T={t} group={group}", log.describe(), *found[:20]]
        batch_totals = {name: sum(r[name] for r in bv["accounting"].values()) for name in harness.ACCOUNTING}
        problems += harness.diff_accounting(totals, batch_totals, "the batch layer's accounting table: ")
    finally:
        functions.drop_namespace(client, ns)
    return problems


def draw_logs(count: int, seed: int) -> list[Log]:
    """``count`` logs from the grammar, as Hypothesis draws them with ``seed`` (each its own
    example: one example holding a whole batch would overrun Hypothesis's choice buffer)."""
    out: list[Log] = []

    @hypothesis.seed(seed)
    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=(Phase.generate,),
        suppress_health_check=list(HealthCheck),
    )
    @given(logs(min_records=10, max_records=60, cross_owner_ids=True, late=False))
    def collect(log: Log) -> None:
        out.append(log)

    collect()
    return out[:count]


@pytest.mark.parametrize("batch_no", range(BATCHES))
def test_replay_and_batch_layer_agree_with_the_specification(kafka_stack, topic_factory, batch_no):
    from tests.integration.verifying import worker_spark

    seed = SEED + batch_no
    rnd = random.Random(seed)
    n, t, group = rnd.randint(2, 5), rnd.randint(1, 3), rnd.choice([1, 7, 200])
    batch = [log.relabel(k) for k, log in enumerate(draw_logs(BATCH, seed))]
    spark = worker_spark(kafka_stack.settings)
    topic = topic_factory(partitions=STRIDE * len(batch))
    problems = run_batch(spark, kafka_stack.settings, topic, batch, n, t, group)
    assert not problems, "\n".join(
        [f"batch seed {seed} (SOCIAL_PROPERTY_SEED={SEED}, batch {batch_no})", *problems]
    )
