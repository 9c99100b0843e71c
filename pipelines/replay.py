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

from infra.cli import command_name, run_main
from infra.settings import Settings, get_settings


def read_log(
    spark: SparkSession, settings: Settings, topic: str, end_offsets: dict[int, int] | None
) -> DataFrame:
    """The log from the earliest offset up to ``end_offsets`` (exclusive; None = the head).

    A partition ``end_offsets`` does not name (no records yet, or none archived yet) is read up
    to 0, i.e. not at all: Kafka's source wants every partition of a subscribed topic named.
    """
    from pipelines.speed.stream import kafka_options, topic_partitions

    reader = (
        spark.read.format("kafka")
        .options(**kafka_options(settings))
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    if end_offsets is not None:
        given = {int(p): int(o) for p, o in end_offsets.items()}
        ends = {str(p): given.get(p, 0) for p in topic_partitions(settings, topic)}
        reader = reader.option("endingOffsets", json.dumps({topic: ends}))
    return reader.load()


def read_range(
    spark: SparkSession, settings: Settings, topic: str, starts: dict[int, int], ends: dict[int, int]
) -> DataFrame:
    """The records of ``topic`` in ``[starts[p], ends[p])``, the partitions with an empty range left
    out (one Spark task per partition; the archiver's ranges and the replay's rounds)."""
    from pipelines.speed.stream import kafka_options

    parts = sorted(p for p in ends if ends[p] > starts[p])
    return (
        spark.read.format("kafka")
        .options(**kafka_options(settings))
        .option("assign", json.dumps({topic: parts}))
        .option("startingOffsets", json.dumps({topic: {str(p): starts[p] for p in parts}}))
        .option("endingOffsets", json.dumps({topic: {str(p): ends[p] for p in parts}}))
        .load()
    )


def replay_keyed(
    spark: SparkSession, settings: Settings, topic: str, end_offsets: dict[int, int] | None, namespace: str
) -> dict[str, int]:
    """Run the live stream's processor over the log up to ``end_offsets`` into ``namespace``.

    The namespace should be empty (a scratch one). As a micro-batch does, each round hands the
    Kafka partitions' ranges, each in offset order, to one task per core (``SOCIAL_SPEED_TASKS``);
    the rounds (:func:`rounds`) advance every partition alike, so the replay applies the log in
    an order close to the live stream's. The state does not depend on that order (docs/views.md),
    but the work does: a whole partition applied before the next one's follows arrive makes each
    of those follows backfill the followee's every post (docs/performance.md: The keyed speed layer).
    Returns the summed counts and the number of rounds.
    """
    from infra.stack import watermarks
    from pipelines.speed.stream import SUMMARY_SCHEMA, apply_partitions, processor_config

    marks = watermarks(settings, topic)
    # (the partitioned layout delivers to every partition of this topic, not of the settings' topic)
    cfg = processor_config(settings, namespace, record_freshness=False, partitions=len(marks))
    tasks = settings.speed_tasks or spark.sparkContext.defaultParallelism
    ends = {p: hi for p, (_lo, hi) in marks.items()} if end_offsets is None else dict(end_offsets)
    starts = {p: min(marks.get(p, (0, 0))[0], end) for p, end in ends.items()}
    keys = ("records", "applied", "duplicates", "rejected", "quarantined", "skipped")
    counts = dict.fromkeys(keys, 0)
    plan = rounds(starts, ends, settings.replay_round_events)
    for lo, hi in plan:
        rows = (
            read_range(spark, settings, topic, lo, hi)
            .select("partition", "offset", "value")
            .coalesce(tasks)
            .mapInArrow(apply_partitions(cfg), SUMMARY_SCHEMA)
            .collect()
        )
        for k in keys:
            counts[k] += sum(r[k] for r in rows)
    return {**counts, "rounds": len(plan)}


def rounds(
    starts: dict[int, int], ends: dict[int, int], round_events: int
) -> list[tuple[dict[int, int], dict[int, int]]]:
    """``[starts, ends)`` cut into rounds of at most ~``round_events`` records, each partition's
    range split at the same fractions (none, when there is nothing to read)."""
    total = sum(max(0, ends[p] - starts[p]) for p in ends)
    if total == 0:
        return []
    n = max(1, -(-total // max(1, round_events)))
    cuts = [{p: starts[p] + max(0, ends[p] - starts[p]) * i // n for p in ends} for i in range(n + 1)]
    return [(cuts[i], cuts[i + 1]) for i in range(n) if any(cuts[i + 1][p] > cuts[i][p] for p in ends)]


def main(argv: list[str] | None = None) -> int:
    from contract import namespaces
    from contract.functions import connect, drop_namespace
    from pipelines.progress import spark_tasks
    from pipelines.spark import build_spark

    p = argparse.ArgumentParser(prog=command_name("pipelines.replay"), description=__doc__.splitlines()[0])
    p.add_argument("--topic")
    p.add_argument("--until", help="JSON {partition: end offset}; default: the head of the log")
    p.add_argument("--namespace", help="the scratch Redis namespace (default: <active>__replay)")
    p.add_argument("--keep", action="store_true", help="keep the replayed namespace")
    args = p.parse_args(argv)
    settings = get_settings()
    namespace = args.namespace or f"{namespaces.active(settings)}__replay"
    client = connect(settings.redis_url)
    drop_namespace(client, namespace)
    spark = build_spark("replay", settings, console_progress=False)  # its own bar below
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
    sys.exit(run_main(main, "pipelines.replay"))
