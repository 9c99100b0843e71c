"""Replay: the keyed processor over the retained log, earliest offset up to a position P.

:func:`replay_keyed` runs :mod:`pipelines.speed.processor`, the same code as the live stream,
over the log up to P into a scratch Redis namespace; ``verify`` compares it key by key with the
live keyed state, ``rebuild`` switches to such a namespace. (The views' second, independent
computation is the batch layer's, :mod:`pipelines.batch_layer`, which ``verify`` runs too.)

CLI: ``python -m pipelines.replay [--topic T] [--until '{"0": 123, ...}'] [--namespace NS]``
replays into a scratch namespace (default ``<active>__replay``), prints the counts and the
events/s, and drops the namespace again unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from pyspark.sql import DataFrame, SparkSession

from infra.settings import Settings, get_settings


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


def main(argv: list[str] | None = None) -> int:
    from pipelines import namespaces
    from pipelines.progress import spark_tasks
    from pipelines.spark import build_spark
    from pipelines.speed.functions import connect, drop_namespace

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topic")
    p.add_argument("--until", help="JSON {partition: end offset}; default: the head of the log")
    p.add_argument("--namespace", help="the scratch Redis namespace (default: <active>__replay)")
    p.add_argument("--keep", action="store_true", help="keep the replayed namespace")
    args = p.parse_args(argv)
    settings = get_settings()
    namespace = args.namespace or f"{namespaces.active(settings)}__replay"
    client = connect(settings.redis_url)
    drop_namespace(client, namespace)
    spark = build_spark("replay", settings)
    spark_tasks(spark, "replay")  # a progress bar on a terminal
    until = {int(k): v for k, v in json.loads(args.until).items()} if args.until else None
    started = time.time()
    counts = replay_keyed(spark, settings, args.topic or settings.events_topic, until, namespace)
    elapsed = time.time() - started
    if not args.keep:
        drop_namespace(client, namespace)
    print(
        json.dumps(
            {
                **counts,
                "namespace": namespace,
                "kept": args.keep,
                "seconds": round(elapsed, 1),
                "events_per_s": round(counts["records"] / max(elapsed, 1e-3)),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
