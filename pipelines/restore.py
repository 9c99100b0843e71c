"""Restore the keyed state in Redis from Delta: after a ``FLUSHALL``, a lost disk, a new Redis.

The compacted views cover a log position P (the last ``batches`` row); everything the processor
needs at P is in Delta at the versions that row records: the views (users, status, follows,
posts, inbox, unread), ``timelines`` (the keyed timelines with their slack), the dedup memory
(the event ids of ``events_bronze`` received within the dedup window and grace of each
partition's newest, as the Redis function keeps them), the erased users (their applied
``user_erased`` events in ``events_bronze``; the ``sent:<u>`` index comes back with the inbox), the accounting (``changelog``
dispositions below P) and the fences (P itself). They are written through the same Redis
function library that the events write with (``social_restore``: the same JSON encoders), so
the restored keys are the keys a replay up to P would have made. Then the speed layer, started
again, reads the log from P: the Delta views plus the log after the position they cover, not
the whole log.

Run with the speed layer stopped: ``python -m pipelines.restore [--namespace NS]``. It refuses
a namespace that still has keys in Redis unless ``--force`` (which drops them first).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Iterable

import redis
from pyspark.sql import functions as F

from infra.settings import Settings, get_settings
from pipelines import namespaces
from pipelines.lake import Lake
from pipelines.speed import functions

log = logging.getLogger("restore")

ROWS_PER_CALL = 500


class RestoreError(RuntimeError):
    pass


def _write(client: redis.Redis, namespace: str, kind: str, rows: Iterable[tuple]) -> int:
    """Rows of one kind through ``social_restore``, ROWS_PER_CALL per call, pipelined."""
    n, chunk, width = 0, [], None
    pipe = client.pipeline(transaction=False)

    def flush():
        if chunk:
            pipe.fcall("social_restore", 0, namespace, kind, width, *[v for row in chunk for v in row])
            chunk.clear()

    for row in rows:
        row = tuple("" if v is None else str(int(v)) if isinstance(v, bool) else str(v) for v in row)
        width = width or len(row)
        chunk.append(row)
        n += 1
        if len(chunk) >= ROWS_PER_CALL:
            flush()
            if len(pipe) >= 20:
                pipe.execute()
    flush()
    pipe.execute()
    return n


def restore(spark, settings: Settings, namespace: str, *, force: bool = False) -> dict:
    client = functions.connect(settings.redis_url)
    existing = next(iter(client.scan_iter(match=f"{namespace}:*", count=1000)), None)
    if existing is not None:
        if not force:
            raise RestoreError(
                f"Redis already holds keys of {namespace!r} (e.g. {existing!r}); --force drops them"
            )
        functions.drop_namespace(client, namespace)
    functions.ensure_loaded(client)
    lake = Lake(spark, settings.lake_dir, namespace)
    record = lake.last_batch() if lake.exists() else None
    if record is None:
        raise RestoreError(
            f"no compacted views for {namespace!r} under {settings.lake_dir}: nothing to restore"
        )
    t0 = time.time()
    v = record.versions
    ends = record.end_offsets

    def at(table: str):
        return lake.read(table, v[table])

    def below_position(df):
        cond = F.lit(False)
        for p, o in ends.items():
            cond = cond | ((F.col("partition") == p) & (F.col("offset") < o))
        return df.where(cond)

    counts: dict[str, int] = {}

    def load(kind: str, df, *cols) -> None:
        counts[kind] = _write(client, namespace, kind, (tuple(r) for r in df.select(*cols).toLocalIterator()))

    load("U", at("users"), "user_id", "handle", "display_name")
    load("S", at("user_status"), "user_id", "text", "event_time")
    follows = at("follows")
    load("F", follows, "user_id", "followee_id")
    celebs = follows.groupBy("followee_id").count().where(F.col("count") > settings.fanout_threshold)
    load("C", celebs, "followee_id")
    load("P", at("posts"), "author_id", "post_id", "event_time", "text", F.col("deleted").cast("int"))
    load("T", at("timelines"), "user_id", "post_id", "event_time")
    load(
        "I",
        at("inbox"),
        "recipient_id",
        "message_id",
        "sender_id",
        "text",
        "event_time",
        F.col("read").cast("int"),
    )
    load("N", at("unread_counts"), "user_id", "unread")

    # the erased users (tombstones, kept forever): their applied user_erased events below P
    bronze = below_position(at("events_bronze"))
    erased = bronze.where((F.col("type") == "user_erased") & (F.col("disposition") == "applied"))
    load("E", erased.select("user_id").distinct(), "user_id")

    # the dedup memory: per partition, each event id's newest received_time, for the ids within
    # the window + grace of the partition's newest received_time (the Redis function's rule)
    hwm = bronze.groupBy("partition").agg(F.max("received_time").alias("hwm"))
    load("H", hwm, "partition", "hwm")
    horizon = settings.dedup_window_ms + settings.dedup_grace_ms
    seen = (
        bronze.groupBy("partition", "event_id")
        .agg(F.max("received_time").alias("rt"))
        .join(hwm, "partition")
        .where(F.col("rt") >= F.col("hwm") - horizon)
    )
    load("D", seen, "partition", "event_id", "rt")

    cl = below_position(at("changelog"))
    names = F.create_map(*[F.lit(x) for kv in {"a": "applied", "d": "duplicates", "r": "rejected",
                                                  "q": "quarantined"}.items() for x in kv])  # fmt: skip
    stats = cl.groupBy("partition", names[F.col("disposition")].alias("field")).count()
    load("X", stats, "partition", "field", "count")
    seq = cl.agg(F.max("seq")).first()[0] or 0
    # every sequence number archived so far stays below the next one Redis hands out
    archived = lake.read("archives").agg(F.max("seq")).first()[0] or 0
    counts["Q"] = _write(client, namespace, "Q", [(max(seq, archived),)])
    counts["Z"] = _write(client, namespace, "Z", sorted(ends.items()))  # last: the position
    report = {
        "namespace": namespace,
        "position": {str(p): o for p, o in ends.items()},
        "batch_id": record.batch_id,
        "rows": counts,
        "seconds": round(time.time() - t0, 1),
    }
    log.info("restored %s at %s in %.1fs: %s", namespace, ends, time.time() - t0, counts)
    return report


def main(argv: list[str] | None = None) -> int:
    from pipelines.spark import build_spark

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--namespace", help="keyed state to restore (default: the active one)")
    p.add_argument("--force", action="store_true", help="drop the namespace's keys in Redis first")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = get_settings()
    namespace = args.namespace or namespaces.active(settings)
    spark = build_spark(f"restore-{namespace}", settings)
    try:
        print(json.dumps(restore(spark, settings, namespace, force=args.force), indent=2))
    except RestoreError as exc:
        print(f"restore: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
