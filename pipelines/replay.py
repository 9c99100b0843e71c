"""Batch replay: every view recomputed from the retained log, earliest offset up to position P.

The same parse and the same fold step as the speed layer (:mod:`pipelines.views`), applied once
to the whole log prefix with empty prior state. ``verify`` compares its result with the live
tables; ``make bench`` times it against a bare read of the same offsets.

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
    reader = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", "true")
    )
    if end_offsets is not None:
        ends = {str(p): int(o) for p, o in end_offsets.items()}
        reader = reader.option("endingOffsets", json.dumps({topic: ends}))
    return reader.load()


def recompute(
    spark: SparkSession, settings: Settings, topic: str, end_offsets: dict[int, int] | None, cfg: ViewConfig
) -> Replay:
    records = materialize(read_log(spark, settings, topic, end_offsets))
    events, quarantine = parse_records(records)
    out = apply_batch(materialize(events), State.empty(spark), cfg)
    return Replay(out=out, quarantine=materialize(quarantine), events_read=records.count())


def main(argv: list[str] | None = None) -> int:
    from pipelines.spark import build_spark
    from pipelines.speed_layer import view_config

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topic")
    p.add_argument("--until", help="JSON {partition: end offset}; default: the head of the log")
    args = p.parse_args(argv)
    settings = get_settings()
    spark = build_spark("replay", settings)
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
