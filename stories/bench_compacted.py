"""``make bench`` section ``compacted``: the compacted topics (pipelines/speed/compacted.py).

One run on the bench's broker and Redis, no Spark: a generated log is applied by the keyed
processor in micro-batches of ``compacted_batch`` records per partition (as the stream's tasks
do), and after each batch the publisher produces the batch's changes to the compacted topics:

- the publisher's ms per batch (p50, p99) beside the processor's own ms per batch for the same
  batch (the speed layer runs the publisher in a thread beside the query, so this is the work it
  adds per batch, not a wait of the next batch);
- after Kafka's cleaner ran (small ``segment.ms``/``min.cleanable.dirty.ratio`` for these topics,
  a bounded wait): the records and bytes of the topics' segment files against the live state
  they hold: the live entities (profiles + follow edges) and Redis's memory of the same keys
  (``users``, ``status``, every ``following:<u>``). Target: topics <= 2x the live state.
- the keyed speed layer's freshness (received -> applied in Redis, p50/p99) with the publisher off
  and on, the real speed layer at ``compacted_ab_rate`` events/s for ``compacted_ab_seconds``
  each, one after the other on fresh topics: what the topics cost the project's main figure.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import redis

from contract.functions import connect as keyed_connect
from infra import clients
from stories.bench_common import (
    BenchContext,
    fill_topic,
    pct,
    reset_freshness,
    section,
    stream_settings,
    wait_applied,
    wait_fences,
)

SEGMENT_MS = 1000
CLEAN_WAIT_S = 120


def _read_log(settings, topic: str) -> dict[int, list[tuple[int, bytes | None]]]:
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    from infra.stack import end_offsets

    ends = {p: o for p, o in end_offsets(settings, topic).items() if o > 0}
    c = clients.kafka_consumer(settings, "bench.compacted")
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    out: dict[int, list] = {p: [] for p in ends}
    left = set(ends)
    deadline = time.monotonic() + 600
    try:
        while left and time.monotonic() < deadline:
            for m in c.consume(10_000, timeout=1.0):
                if m.error() is None:
                    out[m.partition()].append((m.offset(), m.value()))
                    if m.offset() + 1 >= ends[m.partition()]:
                        left.discard(m.partition())
    finally:
        c.close()
    return out


def _segments(data_dir: Path, topic: str) -> tuple[int, int]:
    """Bytes of the topic's segment (.log) files, and its files' allocated bytes on disk."""
    log_bytes = disk = 0
    for d in data_dir.glob(f"{topic}-*"):
        if not d.name[len(topic) + 1 :].isdigit():
            continue
        for f in d.iterdir():
            st = f.stat()
            disk += st.st_blocks * 512
            if f.suffix == ".log":
                log_bytes += st.st_size
    return log_bytes, disk


def _redis_bytes(r: redis.Redis, namespace: str, pattern: str = "following:*", hashes: bool = True) -> int:
    """MEMORY USAGE of the ``users`` and ``status`` hashes and of every key matching ``pattern``."""
    keys = [f"{namespace}:users", f"{namespace}:status"] if hashes else []
    keys += [k.decode() for k in r.scan_iter(match=f"{namespace}:{pattern}", count=2000)]
    pipe = r.pipeline(transaction=False)
    for k in keys:
        pipe.memory_usage(k, samples=0)
    return sum(s or 0 for s in pipe.execute())


def _freshness_with(ctx: BenchContext, publish: bool) -> dict:
    """The real speed layer (a subprocess, as ``make up`` runs it) under a fixed-rate load."""
    from app_sim.generator import GeneratorConfig, produce
    from contract.functions import drop_namespace
    from infra.stack import end_offsets
    from pipelines.speed_layer_process import SpeedLayerProcess
    from pipelines.verify import keyed_freshness

    tag = "on" if publish else "off"
    namespace = f"bench_compacted_ab_{tag}_{ctx.run_id}".lower()
    topic = ctx.topic(f"compacted-ab-{tag}")
    settings = stream_settings(ctx, f"compacted-{tag}", topic, namespace, compacted_topics=int(publish))
    r = keyed_connect(settings.redis_url)
    sl = SpeedLayerProcess(
        settings, topic, namespace, Path(settings.var_dir) / "speed_layer.log", archive=False
    ).start()
    try:
        boot = GeneratorConfig(users=1000, seed=5, graph_seed=5, mean_followers=15, realtime=True)
        produce(20_000, boot, topic=topic, bootstrap=settings, progress=False)
        wait_applied(r, settings, end_offsets(settings, topic), 600, sl.log_path)
        reset_freshness(r, namespace, settings.serving_layout, end_offsets(settings, topic))
        gen = GeneratorConfig(
            users=1000, seed=9, graph_seed=5, mean_followers=15, realtime=True, emit_bootstrap=False
        )
        n = ctx.compacted_ab_rate * ctx.compacted_ab_seconds
        produce(
            n,
            gen,
            topic=topic,
            bootstrap=settings,
            rate=ctx.compacted_ab_rate,
            progress=False,
        )
        wait_fences(r, namespace, end_offsets(settings, topic), 300, settings.serving_layout)
        fresh = keyed_freshness(r, namespace, settings.serving_layout, end_offsets(settings, topic))
        return {
            f"freshness_publisher_{tag}_p50_ms": fresh["p50_ms"],
            f"freshness_publisher_{tag}_p99_ms": fresh["p99_ms"],
        }
    finally:
        sl.stop()
        drop_namespace(r, namespace)
        if publish:
            from pipelines.speed import compacted

            _delete_topics(settings, compacted.topic_names(topic, namespace))


@section("compacted")
def compacted_section(ctx: BenchContext) -> dict:
    out = _size_and_cost(ctx)
    for publish in (False, True):
        out.update(_freshness_with(ctx, publish))
    return out


def _size_and_cost(ctx: BenchContext) -> dict:
    from contract.functions import drop_namespace
    from pipelines import bootstrap
    from pipelines.speed import compacted
    from pipelines.speed.processor import Processor, ProcessorConfig

    events = min(ctx.events, 200_000)
    settings = dataclasses.replace(
        ctx.settings,
        compacted_partitions=1,  # one roll record per topic lets the cleaner reach every segment
        compacted_segment_ms=SEGMENT_MS,
        compacted_min_cleanable_dirty_ratio=0.01,
        compacted_delete_retention_ms=1000,
    )
    namespace = f"bench_compacted_{ctx.run_id}".lower()
    topic, _summary = fill_topic(ctx, "compacted", events, users=max(200, events // 100))
    log = _read_log(settings, topic)
    r = keyed_connect(settings.redis_url)
    proc = Processor(
        ProcessorConfig(redis_url=settings.redis_url, namespace=namespace, record_freshness=False)
    )
    publisher = compacted.Publisher(settings, namespace, topic)
    names = publisher.topics
    try:
        cost = _apply_and_publish(proc, publisher, log, ctx.compacted_batch)
        time.sleep(SEGMENT_MS / 1000 * 1.5)  # every segment older than segment.ms: the next record rolls it
        state, _ = bootstrap.from_topics(settings, topic, namespace)
        live = bootstrap.from_redis(r, namespace)
        entities = len(live.profiles) + len(live.follows)
        size = _size_after_cleaning(settings, publisher, entities)
        log_bytes, records = size["segment_bytes_after_cleaning"], size["records_after_cleaning"]
        redis_bytes = _redis_bytes(r, namespace)
        followers_bytes = _redis_bytes(r, namespace, "followers:*", hashes=False)
        equal = not bootstrap.differences(bootstrap.from_topics(settings, topic, namespace)[0], live)
        return {
            "events": events,
            **cost,
            "live_entities": entities,
            "records_after_cleaning": records,
            "records_per_live_entity": round(records / max(entities, 1), 2),
            "segment_bytes_before_cleaning": size["segment_bytes_before_cleaning"],
            "segment_bytes_after_cleaning": log_bytes,
            "profiles_segment_bytes": size["profiles_segment_bytes"],
            "follows_segment_bytes": size["follows_segment_bytes"],
            "bytes_per_live_profile": round(size["profiles_segment_bytes"] / max(len(live.profiles), 1), 1),
            "bytes_per_live_follow_edge": round(size["follows_segment_bytes"] / max(len(live.follows), 1), 1),
            "disk_bytes_incl_index_files": size["disk_bytes_incl_index_files"],
            "redis_bytes_same_keys": redis_bytes,
            "redis_bytes_incl_followers_index": redis_bytes + followers_bytes,
            "segment_bytes_per_redis_byte": round(log_bytes / max(redis_bytes, 1), 2),
            "within_2x_of_live_state": log_bytes <= 2 * redis_bytes and records <= 2 * entities,
            "bootstrap_equals_redis": equal and len(state.follows) == len(live.follows),
        }
    finally:
        drop_namespace(r, namespace)
        _delete_topics(settings, names)


def _apply_and_publish(proc, publisher, log: dict[int, list], batch: int) -> dict:
    """The log applied in micro-batches of ``batch`` records per partition, the publisher's
    changes produced after each: their ms per batch and what the publisher produced."""
    apply_ms: list[float] = []
    publish_ms: list[float] = []
    produced = tombstones = 0
    start = 0
    longest = max(len(v) for v in log.values())
    while start < longest:
        t0 = time.perf_counter()
        for p, recs in log.items():
            if start < len(recs):
                proc.process(p, recs[start : start + batch])
        apply_ms.append((time.perf_counter() - t0) * 1000)
        got = publisher.publish_once()
        publish_ms.append(got.ms)
        produced += got.profiles + got.follows
        tombstones += got.tombstones
        start += batch
    return {
        "batches": len(apply_ms),
        "records_per_partition_batch": batch,
        "apply_ms_per_batch_p50": pct(apply_ms, 0.5, digits=2),
        "publish_ms_per_batch_p50": pct(publish_ms, 0.5, digits=2),
        "publish_ms_per_batch_p99": pct(publish_ms, 0.99, digits=2),
        "publish_share_of_batch_pct": round(100 * sum(publish_ms) / max(sum(apply_ms), 1e-9), 1),
        "records_produced": produced,
        "tombstones_produced": tombstones,
    }


def _size_after_cleaning(settings, publisher, entities: int) -> dict:
    """The compacted topics' segment bytes before and after Kafka's cleaner ran (rolled until
    their records are within 10% of the ``entities`` they hold, or ``CLEAN_WAIT_S``)."""
    from infra.stack import KafkaBroker
    from pipelines import bootstrap

    names = publisher.topics
    data_dir = KafkaBroker(settings).data_dir
    before = sum(_segments(data_dir, t)[0] for t in (names.profiles, names.follows))
    deadline = time.monotonic() + CLEAN_WAIT_S
    while True:
        _roll(publisher, names)
        time.sleep(3)
        records = sum(bootstrap.read_topic(settings, t).records for t in (names.profiles, names.follows))
        if records <= entities * 1.1 or time.monotonic() > deadline:
            break
    profile_bytes = _segments(data_dir, names.profiles)[0]
    follow_bytes = _segments(data_dir, names.follows)[0]
    return {
        "records_after_cleaning": records,
        "segment_bytes_before_cleaning": before,
        "segment_bytes_after_cleaning": profile_bytes + follow_bytes,
        "profiles_segment_bytes": profile_bytes,
        "follows_segment_bytes": follow_bytes,
        "disk_bytes_incl_index_files": sum(
            _segments(data_dir, t)[1] for t in (names.profiles, names.follows)
        ),
    }


def _delete_topics(settings, names) -> None:
    """Delete the compacted topics (``names``: their profiles and follows), quietly."""
    from infra.stack import delete_topic

    for t in (names.profiles, names.follows):
        try:
            delete_topic(settings, t)
        except Exception:  # noqa: BLE001 - cleanup must not hide the results
            pass


def _roll(publisher, names) -> None:
    """One record per topic, so every older segment can be cleaned (the active one never is): the
    value the topic already holds last for one key, so the state the topics give is unchanged."""
    from pipelines import bootstrap

    for t in (names.profiles, names.follows):
        got = bootstrap.read_topic(publisher.settings, t)
        if got.values:
            k, v = next(iter(got.values.items()))
            publisher.producer.produce(t, key=k, value=v)
    publisher.producer.flush(30)
