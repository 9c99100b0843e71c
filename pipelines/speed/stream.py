"""The keyed speed layer's streaming query: Kafka -> the processor in the executors -> Redis.

Each Kafka partition's records of a micro-batch are one Spark task; ``mapInArrow`` hands the
task's Arrow batches, in offset order, to :class:`pipelines.speed.processor.Processor`, which
applies them to Redis through the project's Redis functions. Nothing of the state goes through
the driver or a shuffle, and no Delta write sits on this path.

Where the stream starts is decided by Redis, not by Spark's checkpoint: the query starts from
the fences (per-partition next offsets) Redis holds, with a fresh checkpoint each start. If Redis
lost its last writes (a restart from its append-only file), its fences rolled back with its
state and the log is re-applied from there; if nothing was lost, the fences skip nothing twice.

Latency knobs, in one place (each a setting, see infra/settings.py and the README):
- ``kafka.fetch.max.wait.ms`` (``SOCIAL_KAFKA_FETCH_MAX_WAIT_MS``, 10 ms): the Kafka consumer's
  wait for data inside every micro-batch; Kafka's default (500 ms) is a floor under every batch;
- the trigger (``SOCIAL_TRIGGER_INTERVAL``, ``0 seconds``): the next micro-batch starts as soon
  as the last one ends;
- ``maxOffsetsPerTrigger`` (``SOCIAL_MAX_OFFSETS_PER_TRIGGER``): bounds a catch-up batch;
- the FAIR scheduler pool ``serving`` (``pipelines/fairscheduler.xml``): when the Delta views
  query shares the driver, this query's tasks go first.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from infra.settings import Settings
from pipelines.speed import functions
from pipelines.speed.processor import Applied, Processor, ProcessorConfig

log = logging.getLogger("speed_layer.keyed")

SUMMARY_SCHEMA = (
    "partition INT, records LONG, applied LONG, duplicates LONG, rejected LONG, quarantined LONG, "
    "skipped LONG, fcalls LONG, first_offset LONG, last_offset LONG"
)

_PROCESSORS: dict[ProcessorConfig, Processor] = {}  # one per Python worker, reused across tasks


def processor_config(settings: Settings, namespace: str, *, record_freshness: bool = True) -> ProcessorConfig:
    return ProcessorConfig(
        redis_url=settings.redis_url,
        namespace=namespace,
        timeline_length=settings.timeline_length,
        fanout_threshold=settings.fanout_threshold,
        dedup_window_ms=settings.dedup_window_ms,
        dedup_grace_ms=settings.dedup_grace_ms,
        group_size=settings.processor_group_size,
        record_freshness=record_freshness,
    )


def apply_partitions(cfg: ProcessorConfig):
    """The ``mapInArrow`` function: Kafka rows (partition, offset, value) -> one summary row each run."""

    def fn(batches: Iterator):
        import pyarrow as pa

        proc = _PROCESSORS.get(cfg)
        if proc is None:
            proc = _PROCESSORS[cfg] = Processor(cfg)
        for batch in batches:
            parts = batch.column("partition").to_pylist()
            offsets = batch.column("offset").to_pylist()
            values = batch.column("value").to_pylist()
            rows, start = [], 0
            while start < len(parts):  # runs of one partition (a task normally holds one)
                end = start
                while end < len(parts) and parts[end] == parts[start]:
                    end += 1
                done: Applied = proc.process(
                    parts[start], zip(offsets[start:end], values[start:end], strict=True)
                )
                rows.append(
                    {
                        "partition": parts[start],
                        "records": done.records,
                        "applied": done.applied,
                        "duplicates": done.duplicates,
                        "rejected": done.rejected,
                        "quarantined": done.quarantined,
                        "skipped": done.skipped,
                        "fcalls": done.fcalls,
                        "first_offset": offsets[start],
                        "last_offset": offsets[end - 1],
                    }
                )
                start = end
            if rows:
                yield pa.RecordBatch.from_pylist(rows, schema=_arrow_schema())

    return fn


def _arrow_schema():
    import pyarrow as pa

    return pa.schema(
        [("partition", pa.int32())]
        + [
            (n, pa.int64())
            for n in (
                "records",
                "applied",
                "duplicates",
                "rejected",
                "quarantined",
                "skipped",
                "fcalls",
                "first_offset",
                "last_offset",
            )
        ]
    )


def topic_partitions(settings: Settings, topic: str, timeout_s: float = 10.0) -> list[int]:
    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": settings.kafka_bootstrap}).list_topics(topic, timeout=timeout_s)
    t = meta.topics.get(topic)
    if t is None or t.error is not None:
        raise RuntimeError(f"topic {topic}: {t.error if t else 'not found'}")
    return sorted(t.partitions)


def starting_offsets(settings: Settings, namespace: str, topic: str) -> str:
    """Kafka ``startingOffsets`` from Redis's fences: every partition, -2 (earliest) where none."""
    client = functions.connect(settings.redis_url)
    fences = functions.fences(client, namespace)
    if not fences:
        return "earliest"
    return json.dumps({topic: {str(p): fences.get(p, -2) for p in topic_partitions(settings, topic)}})


def kafka_options(settings: Settings) -> dict[str, str]:
    """The Kafka source options every reader of the log uses (the stream, replay, bench)."""
    return {
        "kafka.bootstrap.servers": settings.kafka_bootstrap,
        "kafka.fetch.max.wait.ms": str(settings.kafka_fetch_max_wait_ms),
        "failOnDataLoss": "true",
    }


def kafka_stream(spark, settings: Settings, topic: str, max_offsets: int | None = None):
    """The event log as a stream of Kafka records from the earliest offset (the views query, the
    analytics and the bench read it so; the keyed query starts from its fences instead)."""
    return (
        spark.readStream.format("kafka")
        .options(**kafka_options(settings))
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", max_offsets or settings.max_offsets_per_trigger)
        .load()
    )


def fresh_checkpoint(settings: Settings, namespace: str) -> Path:
    """A new checkpoint for this start (the fences in Redis say where to start, not Spark)."""
    root = Path(settings.var_dir) / "checkpoints" / namespace / "keyed"
    if root.exists():
        shutil.rmtree(root)
    path = root / str(int(time.time() * 1000))
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def start(
    spark,
    settings: Settings,
    namespace: str,
    topic: str,
    *,
    available_now: bool = False,
    on_batch: Callable[[list], None] | None = None,
):
    """Start the keyed query; returns the StreamingQuery (``available_now``: stops when caught up).

    ``on_batch(summary rows)`` is called after each micro-batch that read records (the compacted
    topics' publisher wakes on it: :mod:`pipelines.speed.compacted`); it must not block."""
    cfg = processor_config(settings, namespace)
    functions.ensure_loaded(functions.connect(settings.redis_url))
    fn = apply_partitions(cfg)

    def each_batch(records, batch_id: int) -> None:
        t0 = time.time()
        rows = records.mapInArrow(fn, SUMMARY_SCHEMA).collect()
        if rows:
            total = {
                k: sum(r[k] for r in rows)
                for k in ("records", "applied", "duplicates", "rejected", "quarantined", "skipped")
            }
            log.info("keyed batch %d: %s in %.3fs", batch_id, total, time.time() - t0)
            if on_batch is not None:
                on_batch(rows)

    reader = spark.readStream.format("kafka").options(**kafka_options(settings))
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", "serving")
    try:
        query = (
            reader.option("subscribe", topic)
            .option("startingOffsets", starting_offsets(settings, namespace, topic))
            .option("maxOffsetsPerTrigger", settings.max_offsets_per_trigger)
            .load()
            .select("partition", "offset", "value")
            .writeStream.foreachBatch(each_batch)
            .option("checkpointLocation", str(fresh_checkpoint(settings, namespace)))
            .queryName(f"keyed_{namespace}")
            .trigger(
                **({"availableNow": True} if available_now else {"processingTime": settings.trigger_interval})
            )
            .start()
        )
    finally:
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", None)
    return query


def consumer_group(namespace: str, role: str) -> str:
    """The Kafka consumer group a role's position is committed under (for ``kafka-consumer-groups``)."""
    return f"social.{role}.{namespace}"


def commit_positions(
    settings: Settings, topic: str, namespace: str, positions: dict[str, dict[int, int]]
) -> None:
    """Commit positions (role -> partition -> next offset) as consumer-group offsets.

    Spark's Kafka source keeps its offsets in its checkpoint, not in Kafka; committing them here
    makes the speed layer's fences and the archive's position visible to the tools Kafka users
    reach for (``kafka-consumer-groups.sh --describe --group social.speed-layer.<ns>`` shows the
    lag). Nothing reads them back: the fences in Redis and the Delta commits stay the truth.
    """
    from confluent_kafka import Consumer, TopicPartition

    for role, offsets in positions.items():
        if not offsets:
            continue
        c = Consumer(
            {
                "bootstrap.servers": settings.kafka_bootstrap,
                "group.id": consumer_group(namespace, role),
                "enable.auto.commit": False,
            }
        )
        try:
            c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
        finally:
            c.close()
