"""The keyed speed layer's streaming query: Kafka -> the processor in the executors -> Redis.

The Kafka partitions' records of a micro-batch are coalesced into one Spark task per core;
``mapInArrow`` hands each task's Arrow batches, every partition's records in offset order, to
:class:`pipelines.speed.processor.Processor`, which
applies them to Redis through the project's Redis functions. Nothing of the state goes through
the driver or a shuffle, and no Delta write sits on this path.

Where the stream starts is decided by Redis, not by Spark's checkpoint: the query starts from
the fences (per-partition next offsets) Redis holds, with a fresh checkpoint each start. If Redis
lost its last writes (a restart from its append-only file), its fences rolled back with its
state and the log is re-applied from there; if nothing was lost, the fences skip nothing twice.

Latency knobs, in one place (each a setting, see infra/settings.py and docs/configuration.md):
- ``kafka.fetch.max.wait.ms`` (``SOCIAL_KAFKA_FETCH_MAX_WAIT_MS``, 10 ms): the Kafka consumer's
  wait for data inside every micro-batch; Kafka's default (500 ms) is a floor under every batch;
- the trigger (``SOCIAL_TRIGGER_INTERVAL``, ``0 seconds``): the next micro-batch starts as soon
  as the last one ends;
- the idle poll (``SOCIAL_IDLE_POLL_MS``, 50 ms): when the last look at the log found nothing new,
  the query waits this long before asking the broker again: an idle stream's CPU (its JVM and the
  broker answering it) against the wait of the first record after a quiet spell (the measured
  figures are the setting's documentation in infra/settings.py);
- ``maxOffsetsPerTrigger`` (``SOCIAL_MAX_OFFSETS_PER_TRIGGER``): bounds a catch-up batch;
- the tasks per batch (``SOCIAL_SPEED_TASKS``, one per core): the partitions are coalesced;
- asynchronous progress tracking (``SOCIAL_ASYNC_PROGRESS``, on): Spark's offset and commit logs
  are written in the background, not before and after every batch (see
  :func:`async_progress_options` for why that is safe here);
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
from typing import TYPE_CHECKING

from pyspark.sql.streaming import StreamingQueryListener

from contract import functions
from infra import clients
from infra.settings import Settings
from pipelines.speed.processor import Applied, Processor, ProcessorConfig
from pipelines.stream_progress import ProgressFile, progress_dir

if TYPE_CHECKING:  # imported where the partitioned layout is used
    from pipelines.speed.partitioned import PartitionedProcessor

log = logging.getLogger("speed_layer.keyed")

SUMMARY_SCHEMA = (
    "partition INT, records LONG, applied LONG, duplicates LONG, rejected LONG, quarantined LONG, "
    "skipped LONG, fcalls LONG, first_offset LONG, last_offset LONG"
)

_PROCESSORS: dict[ProcessorConfig, Processor | PartitionedProcessor] = {}  # one per Python worker, reused


def processor_for(cfg: ProcessorConfig) -> Processor | PartitionedProcessor:
    """This Python worker's :class:`Processor` for ``cfg`` (its Redis connection and the check
    that the function library is loaded, paid once per worker, not once per task).

    Module-level on purpose: the ``mapInArrow`` function below is a closure, which cloudpickle
    ships by value with a copy of the globals it names, so a cache it held itself would be a new,
    empty dict in every task; a module function is shipped by reference and finds this module's.
    """
    proc = _PROCESSORS.get(cfg)
    if proc is None:
        if cfg.layout == "partitioned":
            from pipelines.speed.partitioned import PartitionedProcessor

            proc = _PROCESSORS[cfg] = PartitionedProcessor(cfg, cfg.partitions)
        else:
            proc = _PROCESSORS[cfg] = Processor(cfg)
    return proc


def _partitioned(proc: Processor | PartitionedProcessor) -> PartitionedProcessor:
    """The processor :func:`processor_for` made for a partitioned layout's config."""
    from pipelines.speed.partitioned import PartitionedProcessor

    assert isinstance(proc, PartitionedProcessor), "a config of the partitioned layout"
    return proc


def processor_config(
    settings: Settings, namespace: str, *, record_freshness: bool = True, partitions: int = 0
) -> ProcessorConfig:
    return ProcessorConfig(
        layout=settings.serving_layout,
        partitions=partitions or settings.events_partitions,
        redis_url=settings.redis_url,
        namespace=namespace,
        timeline_length=settings.timeline_length,
        fanout_threshold=settings.fanout_threshold,
        dedup_window_ms=settings.dedup_window_ms,
        dedup_grace_ms=settings.dedup_grace_ms,
        dedup_reorder=settings.dedup_reorder,
        group_size=settings.processor_group_size,
        group_posts=settings.processor_group_posts,
        record_freshness=record_freshness,
    )


def apply_partitions(cfg: ProcessorConfig):
    """The ``mapInArrow`` function: Kafka rows (partition, offset, value) -> one summary row each run."""

    def fn(batches: Iterator):
        import pyarrow as pa

        proc = processor_for(cfg)
        for batch in batches:
            parts = batch.column("partition").to_pylist()
            offsets = batch.column("offset").to_pylist()
            values = batch.column("value").to_pylist()
            rows, start = [], 0
            while start < len(parts):  # runs of one partition (a coalesced task holds several)
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
            if cfg.layout == "partitioned":  # the posts, deletes and erasures, to every partition
                _partitioned(proc).pump({r["partition"] for r in rows})
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
    from confluent_kafka import KafkaException

    from infra.cli import Unreachable

    try:
        meta = clients.kafka_admin(settings).list_topics(topic, timeout=timeout_s)
    except KafkaException as exc:  # no broker answered within timeout_s: one line, not a traceback
        raise Unreachable("Kafka", f"{settings.kafka_bootstrap}: {exc.args[0].str()}") from exc
    t = meta.topics.get(topic)
    if t is None or t.error is not None:
        raise RuntimeError(f"topic {topic}: {t.error if t else 'not found'}")
    return sorted(t.partitions)


def starting_offsets(settings: Settings, namespace: str, topic: str) -> str:
    """Kafka ``startingOffsets`` from Redis's fences: every partition, -2 (earliest) where none."""
    client = functions.connect(settings.redis_url)
    parts = topic_partitions(settings, topic)
    fences = functions.layout_fences(client, namespace, settings.serving_layout, len(parts), whole=False)
    if not fences:
        return "earliest"
    return json.dumps({topic: {str(p): fences.get(p, -2) for p in parts}})


def kafka_options(settings: Settings) -> dict[str, str]:
    """The Kafka source options every reader of the log uses (the stream, replay, bench): the
    brokers and their security (``kafka.``-prefixed, :func:`infra.clients.spark_kafka_options`)."""
    return {
        **clients.spark_kafka_options(settings),
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


def async_progress_options(settings: Settings) -> dict[str, str]:
    """Spark's asynchronous progress tracking for the keyed query (``SOCIAL_ASYNC_PROGRESS``).

    Each micro-batch otherwise writes its offsets to the checkpoint before it runs and its commit
    after, ~120 ms of an idle batch's ~290 ms on this machine (the progress events' ``walCommit``
    and ``commitOffsets``). In the background, a crash can lose the last batches' commits, and
    Spark then runs them again; Spark allows that only for sinks where it is harmless (the
    ``noop`` sink this query writes to is one). Here it is harmless by construction as well:
    every event's effects change with its partition's fence in one atomic step, so a batch
    applied again changes nothing, and a start never resumes from this checkpoint anyway (the
    fences in Redis decide where)."""
    if not settings.async_progress:
        return {}
    return {"asyncProgressTrackingEnabled": "true"}


def fresh_checkpoint(settings: Settings, namespace: str) -> Path:
    """A new checkpoint for this start (the fences in Redis say where to start, not Spark)."""
    root = Path(settings.var_dir) / "checkpoints" / namespace / "keyed"
    if root.exists():
        shutil.rmtree(root)
    path = root / str(int(time.time() * 1000))
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


COUNTS = ("applied", "duplicates", "rejected", "quarantined", "skipped")
OBSERVATION = "keyed"  # the name of the per-batch counts in the query's progress (observedMetrics)


def start(
    spark,
    settings: Settings,
    namespace: str,
    topic: str,
    *,
    available_now: bool = False,
    on_batch: Callable[[dict], None] | None = None,
):
    """Start the keyed query; returns the StreamingQuery (``available_now``: stops when caught up).

    The processor runs inside the streaming plan (``mapInArrow`` on the stream, a ``noop`` sink),
    so the function is shipped once at the start, not planned again in Python every micro-batch
    as a ``foreachBatch`` would (~55 ms of every batch on this machine). The counts it returns
    are summed per batch by ``observe``; :class:`BatchLog` logs them and calls ``on_batch(counts)``
    after each batch that read records (the compacted topics' publisher wakes on it: it must not
    block)."""
    from pyspark.sql import functions as F

    cfg = processor_config(settings, namespace, partitions=len(topic_partitions(settings, topic)))
    client = functions.connect(settings.redis_url)
    # the layout's library only (a Redis Cluster runs the partitioned one, on every master)
    (functions.ensure_partitioned_loaded if cfg.layout == "partitioned" else functions.ensure_loaded)(client)
    if cfg.layout == "partitioned":
        # deliveries a crash left in the outboxes: applied before any new record
        _partitioned(processor_for(cfg)).settle()
    # one task per core, each applying its Kafka partitions one after the other: with a task per
    # partition, a batch of 8 partitions on 2 cores pays 4 waves of task start-up
    tasks = settings.speed_tasks or spark.sparkContext.defaultParallelism
    name = f"keyed_{namespace}"
    spark.streams.addListener(BatchLog(name, on_batch))
    # its rates, batch duration and per-partition lag, for the metrics exporter
    spark.streams.addListener(ProgressFile(progress_dir(settings)))
    reader = spark.readStream.format("kafka").options(**kafka_options(settings))
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", "serving")
    try:
        applied = (
            reader.option("subscribe", topic)
            .option("startingOffsets", starting_offsets(settings, namespace, topic))
            .option("maxOffsetsPerTrigger", settings.max_offsets_per_trigger)
            .load()
            .select("partition", "offset", "value")
            .coalesce(tasks)
            .mapInArrow(apply_partitions(cfg), SUMMARY_SCHEMA)
        )
        query = (
            applied.observe(OBSERVATION, *(F.sum(c).alias(c) for c in COUNTS))
            .writeStream.format("noop")
            .option("checkpointLocation", str(fresh_checkpoint(settings, namespace)))
            .options(**({} if available_now else async_progress_options(settings)))
            .queryName(name)
            .trigger(
                **({"availableNow": True} if available_now else {"processingTime": settings.trigger_interval})
            )
            .start()
        )
    finally:
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", None)
    return query


class BatchLog(StreamingQueryListener):
    """Logs each micro-batch of the keyed query that read records, with the processor's counts:
    ``keyed batch 12: {'records': 384, 'applied': 380, ...} in 0.182s`` (from Spark's listener bus,
    off the query's path)."""

    def __init__(self, query_name: str, on_batch: Callable[[dict], None] | None = None):
        self.query_name = query_name
        self.on_batch = on_batch

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        p = event.progress
        if p.name != self.query_name or not p.numInputRows:
            return
        row = p.observedMetrics.get(OBSERVATION)
        counts = {"records": p.numInputRows, **{c: int(row[c] or 0) if row else 0 for c in COUNTS}}
        log.info("keyed batch %d: %s in %.3fs", p.batchId, counts, p.batchDuration / 1000)
        if self.on_batch is not None:
            self.on_batch(counts)

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass


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
    from confluent_kafka import TopicPartition

    for role, offsets in positions.items():
        if not offsets:
            continue
        c = clients.kafka_consumer(settings, consumer_group(namespace, role))
        try:
            c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
        finally:
            c.close()
