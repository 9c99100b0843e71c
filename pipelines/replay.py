"""Batch replay: the state recomputed from the retained log, earliest offset up to position P.

Two replays, one per query of the speed layer, each with that query's own code:

- :func:`replay_keyed`: the keyed processor (:mod:`pipelines.speed.processor`, the same code as
  the live stream) over the log up to P into a scratch Redis namespace; ``verify`` compares it
  key by key with the live keyed state, ``rebuild`` switches to such a namespace.
- :func:`recompute`: the same parse and fold step as the Delta views query
  (:mod:`pipelines.views`), applied once to the whole prefix with empty prior state; ``verify``
  compares it with the live Delta tables.

CLI: ``python -m pipelines.replay [--topic T] [--until '{"0": 123, ...}']`` prints row counts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from infra.settings import Settings, get_settings
from pipelines.parse import parse_records
from pipelines.views import BatchOutput, State, ViewConfig, apply_batch, materialize


@dataclass
class Replay:
    out: BatchOutput
    quarantine: DataFrame
    events_read: int

    def tables(self) -> dict[str, DataFrame]:
        """The recomputed content of every table, as the speed layer's tables hold it."""
        o = self.out
        rejected = o.rejected.select(*self.quarantine.columns)
        return {
            "events_bronze": o.bronze,
            "quarantine": self.quarantine.unionByName(rejected),
            "users": o.users,
            "follows": o.follows_upserts,
            "posts": o.posts,
            "home_timeline": o.timeline_inserts,
            "inbox": o.inbox,
            "unread_counts": o.unread_counts,
            "user_status": o.user_status,
        }


def read_log(
    spark: SparkSession, settings: Settings, topic: str, end_offsets: dict[int, int] | None
) -> DataFrame:
    """The log from the earliest offset up to ``end_offsets`` (exclusive; None = the head)."""
    from pipelines.speed.stream import kafka_options

    reader = (
        spark.read.format("kafka")
        .options(**kafka_options(settings))
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    if end_offsets is not None:
        ends = {str(p): int(o) for p, o in end_offsets.items()}
        reader = reader.option("endingOffsets", json.dumps({topic: ends}))
    return reader.load()


def replay_keyed(
    spark: SparkSession, settings: Settings, topic: str, end_offsets: dict[int, int] | None, namespace: str
) -> dict[str, int]:
    """Run the live stream's processor over the log up to ``end_offsets`` into ``namespace``.

    The namespace should be empty (a scratch one); the Kafka batch source gives one Spark task per
    partition, in offset order, exactly as a micro-batch does. Returns the summed counts.
    """
    from pipelines.speed.stream import SUMMARY_SCHEMA, apply_partitions, processor_config

    cfg = processor_config(settings, namespace, record_freshness=False)
    rows = (
        read_log(spark, settings, topic, end_offsets)
        .select("partition", "offset", "value")
        .mapInArrow(apply_partitions(cfg), SUMMARY_SCHEMA)
        .collect()
    )
    keys = ("records", "applied", "duplicates", "rejected", "quarantined", "skipped")
    return {k: sum(r[k] for r in rows) for k in keys}


def recompute(
    spark: SparkSession, settings: Settings, topic: str, end_offsets: dict[int, int] | None, cfg: ViewConfig
) -> Replay:
    records = materialize(read_log(spark, settings, topic, end_offsets))
    events, quarantine = parse_records(records)
    out = apply_batch(materialize(events), State.empty(spark), cfg)
    return Replay(out=out, quarantine=materialize(quarantine), events_read=records.count())


def main(argv: list[str] | None = None) -> int:
    from pipelines.progress import spark_tasks
    from pipelines.spark import build_spark
    from pipelines.views import view_config

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topic")
    p.add_argument("--until", help="JSON {partition: end offset}; default: the head of the log")
    args = p.parse_args(argv)
    settings = get_settings()
    spark = build_spark("replay", settings)
    spark_tasks(spark, "replay")  # a progress bar on a terminal
    until = {int(k): v for k, v in json.loads(args.until).items()} if args.until else None
    started = time.time()
    replay = recompute(spark, settings, args.topic or settings.events_topic, until, view_config(settings))
    counts = {name: df.count() for name, df in replay.tables().items()}
    elapsed = time.time() - started
    print(
        json.dumps(
            {
                "events_read": replay.events_read,
                "seconds": round(elapsed, 1),
                "events_per_s": round(replay.events_read / elapsed),
                "rows": counts,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
