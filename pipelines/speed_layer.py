"""The Kappa speed layer: Kafka ``social.events`` -> Redis (keyed state, served at once) + Delta views.

Two streaming queries share one driver:

1. **keyed** (:mod:`pipelines.speed.stream`), the serving path: the per-partition processor in
   the executors applies each record to the keyed state in Redis through the project's Redis
   functions (fan-out, refills, dedup, per-partition fences and a changelog entry, atomically per
   event). Micro-batches of ~0.1-0.5 s; no Delta on this path.
2. **views** (this module's :class:`BatchProcessor`), off the serving path: the Delta tables
   (bronze archive, quarantine, views, ``batches``) folded with :func:`pipelines.views.apply_batch`
   over prior state read from Delta at the versions the previous batch recorded, fenced with
   Delta's idempotent writes. Its Kafka offsets live in its own checkpoint, so a restart after
   ``kill -9`` re-runs the unfinished batch and the fences make that change nothing. It is the
   set-wise implementation of the same specification: ``verify`` compares Redis with it when
   both cover the same log position (docs/architecture.md says what replaces it next).

Run in the foreground: ``python -m pipelines.speed_layer``; ``make up`` runs it in the background
with its log under ``var/log/speed_layer.log``.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from infra.settings import Settings, get_settings
from pipelines import namespaces
from pipelines.lake import Lake
from pipelines.parse import parse_records
from pipelines.spark import build_spark
from pipelines.speed import stream as keyed
from pipelines.speed.stream import kafka_stream
from pipelines.views import ViewConfig, apply_batch, materialize

log = logging.getLogger("speed_layer")


def view_config(settings: Settings) -> ViewConfig:
    return ViewConfig(
        timeline_length=settings.timeline_length,
        fanout_threshold=settings.fanout_threshold,
        dedup_window_ms=settings.dedup_window_ms,
    )


def checkpoint_dir(settings: Settings, namespace: str) -> Path:
    return Path(settings.var_dir) / "checkpoints" / namespace / "speed_layer"


def _read_extent(records: DataFrame, previous: dict[int, int]) -> tuple[int, dict[int, int]]:
    """Records read and the end offset per partition after this batch, in one Spark job."""
    ends, n = dict(previous), 0
    for r in records.groupBy("partition").agg(F.max("offset").alias("m"), F.count("*").alias("n")).collect():
        ends[int(r["partition"])] = max(ends.get(int(r["partition"]), 0), int(r["m"]) + 1)
        n += int(r["n"])
    return n, dict(sorted(ends.items()))


class BatchProcessor:
    """``foreachBatch`` body of the views query: one fold step, written to Delta exactly once."""

    def __init__(self, spark, lake: Lake, cfg: ViewConfig):
        self.spark, self.lake, self.cfg = spark, lake, cfg

    def __call__(self, records: DataFrame, batch_id: int) -> None:
        started = time.time()
        prev = self.lake.last_batch()
        if prev is not None and prev.batch_id >= batch_id:
            # Delta already has this batch (crash after the batches row, before Spark's commit).
            log.info("batch %d already committed to Delta; skipping", batch_id)
            return
        phases: dict[str, float] = {}

        def phase(name: str, t0: list[float] = [started]) -> None:  # noqa: B006 - a tiny stopwatch
            now = time.time()
            phases[name] = round(now - t0[0], 2)
            t0[0] = now

        records = materialize(records)
        n_read, end_offsets = _read_extent(records, prev.end_offsets if prev else {})
        phase("read")
        events, quarantine = parse_records(records)
        events = materialize(events)
        quarantine = materialize(quarantine)
        phase("parse")
        state = self.lake.state(prev)
        phase("state")
        out = apply_batch(events, state, self.cfg)
        phase("fold")
        visible_at = int(time.time() * 1000)  # in the Delta views once this batch commits
        counts = {r["disposition"]: r["count"] for r in out.bronze.groupBy("disposition").count().collect()}
        hist = {
            str(r["b"]): r["count"]
            for r in events.groupBy((F.col("received_time") / 100).cast("long").alias("b")).count().collect()
        }
        n_quarantined = quarantine.count() + counts.get("rejected", 0)
        meta = {
            "end_offsets": {str(p): o for p, o in end_offsets.items()},
            "events_read": n_read,
            "applied": counts.get("applied", 0),
            "duplicates": counts.get("duplicate", 0),
            "quarantined": n_quarantined,
            "min_received": min((int(b) * 100 for b in hist), default=None),
            "max_received": max((int(b) * 100 for b in hist), default=None),
            "received_hist": json.dumps(hist),
            "visible_at": visible_at,
        }
        phase("accounting")
        meta["phases"] = dict(phases)
        self.lake.write_batch(batch_id, out, quarantine, meta)
        phase("delta")
        log.info(
            "batch %d: %d read, %d applied, %d duplicates, %d quarantined in %.1fs %s",
            batch_id,
            n_read,
            meta["applied"],
            meta["duplicates"],
            n_quarantined,
            time.time() - started,
            phases,
        )


def run(
    settings: Settings,
    *,
    namespace: str | None = None,
    topic: str | None = None,
    available_now: bool = False,
    with_redis: bool = True,
    with_views: bool = True,
) -> None:
    """Start the speed layer; returns when its queries stop (``available_now``: when caught up)."""
    namespace = namespace or namespaces.active(settings)
    topic = topic or settings.events_topic
    spark = build_spark(f"speed-layer-{namespace}", settings)
    queries = []
    if with_redis:
        queries.append(keyed.start(spark, settings, namespace, topic, available_now=available_now))
    if with_views:
        lake = Lake(spark, settings.lake_dir, namespace)
        lake.ensure_tables()
        processor = BatchProcessor(spark, lake, view_config(settings))
        writer = (
            kafka_stream(spark, settings, topic)
            .writeStream.foreachBatch(processor)
            .option("checkpointLocation", str(checkpoint_dir(settings, namespace)))
            .queryName(f"speed_layer_{namespace}")
        )
        writer = (
            writer.trigger(availableNow=True)
            if available_now
            else writer.trigger(processingTime=settings.views_trigger_interval)
        )
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", "views")
        queries.append(writer.start())
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", None)
    log.info(
        "speed layer running: namespace=%s topic=%s queries=%s", namespace, topic, [q.name for q in queries]
    )

    stopping = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())
        signal.signal(signal.SIGINT, lambda *_: stopping.set())
    # Stop between micro-batches, not in the middle of one: a views batch interrupted after some
    # of its Delta writes is re-run at the next start (harmless, but it delays what Delta covers).
    deadline = None
    while any(q.isActive for q in queries):
        for q in queries:
            if q.exception() is not None:
                for other in queries:
                    if other is not q and other.isActive:
                        other.stop()
                raise q.exception()
        if stopping.is_set():
            deadline = deadline or time.monotonic() + 120
            if all(not q.isActive or not q.status["isTriggerActive"] for q in queries) or (
                time.monotonic() > deadline
            ):
                log.info("stopping")
                for q in queries:
                    q.stop()
                break
        time.sleep(0.5)
    for q in queries:
        if q.exception() is not None:
            raise q.exception()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--namespace", help="views version to maintain (default: the active one)")
    p.add_argument("--topic", help="event topic (default: SOCIAL_EVENTS_TOPIC)")
    p.add_argument("--available-now", action="store_true", help="process what is in the log, then stop")
    p.add_argument("--no-redis", action="store_true", help="maintain the Delta views only")
    p.add_argument("--no-views", action="store_true", help="maintain the keyed state in Redis only")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    run(
        get_settings(),
        namespace=args.namespace,
        topic=args.topic,
        available_now=args.available_now,
        with_redis=not args.no_redis,
        with_views=not args.no_views,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
