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

In the partitioned layout (``SOCIAL_SERVING_LAYOUT=partitioned``) the same rows go to each
partition's keys through that library's ``p_restore``, one partition per call
(:func:`restore_partitioned`).

Run with the speed layer stopped: ``python -m pipelines.restore [--namespace NS]``. It refuses
a namespace that still has keys in Redis unless ``--force`` (which drops them first).

Lambda's way to a new namespace (``rebuild_views`` with ``source=batch``):
``python -m pipelines.restore --namespace NEW --from-batch NEW-batch`` first writes NEW's Delta
tables from the batch layer's views at the position P they cover (:func:`seed_from_batch`), as a
compaction would have left them at P, then restores Redis from them as above; the speed layer
started on NEW reads the log from P.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Iterable

import redis
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F

from contract import functions, namespaces
from infra import logs
from infra.cli import command_name, run_main
from infra.clients import redis_client
from infra.settings import Settings, get_settings
from pipelines import derived
from pipelines.archiver import BRONZE_DISPOSITION
from pipelines.batch_layer.definition import QUARANTINED, SEQUENCED, below, writer_runs
from pipelines.lake import Lake, latest_metadata, side_by_side
from pipelines.tables import TABLES, VIEWS

log = logging.getLogger("restore")

ROWS_PER_CALL = 500


class RestoreError(RuntimeError):
    pass


def _one_row(aggregate: DataFrame) -> Row:
    """The row of an aggregate without a grouping (always one; ``first`` is typed Optional)."""
    row = aggregate.first()
    assert row is not None
    return row


def _write(client: redis.Redis, namespace: str, kind: str, rows: Iterable[tuple]) -> int:
    """Rows of one kind through ``social_restore``, ROWS_PER_CALL per call, pipelined."""
    n, width = 0, None
    chunk: list[tuple[str, ...]] = []
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


# the changelog's disposition codes by the words bronze and the batch layer use (the archiver's map, inverted)
DISPOSITION_CODE = {word: code for code, word in BRONZE_DISPOSITION.items()} | {QUARANTINED: "q"}
DISPOSITION_KEYS = ("records", "applied", "duplicates", "rejected", "quarantined")


def seed_from_batch(spark, settings: Settings, namespace: str, batch_namespace: str) -> dict[int, int]:
    """Write the Delta tables of a new ``namespace`` from the batch views of ``batch_namespace``.

    The result is what the archiver and one compaction would have written at the position P the
    batch views cover (their ``accounting`` commit records P and the archive they read):

    - the stored views (``home_timeline`` is derived from ``posts`` and ``follows``:
      :mod:`pipelines.derived`);
    - the archive below P: the source's ``events_bronze`` with the batch layer's dispositions,
      and its ``quarantine``;
    - ``changelog``: one row per record below P with the batch layer's disposition and no view
      changes (the views hold them), so the accounting restores from it as usual;
    - archive 0 and batch 0, covering P: the archiver and the compaction go on from there.

    Returns P.
    """
    root = settings.lake_dir
    meta = latest_metadata(root / batch_namespace / "accounting", "position")
    if meta is None:
        raise RestoreError(f"no batch views under {root / batch_namespace}: run the batch layer first")
    if (root / namespace).exists():
        raise RestoreError(f"{root / namespace} already exists: seed a new namespace")
    position = {int(p): int(o) for p, o in meta["position"].items()}
    source = Lake(spark, root, meta["source"])
    lake = Lake(spark, root, namespace, writer="seed")
    lake.ensure_tables()

    def batch(table: str):
        return spark.read.format("delta").load(str(root / batch_namespace / table))

    dispositions = batch("dispositions").select("partition", "offset", "disposition", "reason")
    code = F.create_map(*[F.lit(x) for kv in DISPOSITION_CODE.items() for x in kv])
    changelog = dispositions.select(
        "partition",
        "offset",
        F.lit(0).cast("bigint").alias("seq"),
        code[F.col("disposition")].alias("disposition"),
        "reason",
        F.lit(None).cast("string").alias("changes"),
        F.lit(0).cast("bigint").alias("archive_id"),
    )
    bronze = (
        below(source.read("events_bronze"), position)
        .drop("disposition", "reason")
        .join(dispositions.where(F.col("disposition") != QUARANTINED), ["partition", "offset"])
    )
    acct = batch("accounting").agg(*[F.sum(c).alias(c) for c in DISPOSITION_KEYS]).first()
    archive = {
        "archive_id": 0,
        "start_offsets": {str(p): 0 for p in position},
        "end_offsets": {str(p): o for p, o in position.items()},
        "seq": 0,
    }
    row = {
        **archive,
        "start_offsets": json.dumps(archive["start_offsets"]),
        "end_offsets": json.dumps(archive["end_offsets"]),
        **{k: int(acct[k] or 0) for k in DISPOSITION_KEYS},
        "received_hist": "{}",
        "archived_at": int(time.time() * 1000),
    }
    writes = [
        lambda: lake.append("changelog", changelog),
        lambda: lake.append("events_bronze", bronze),
        lambda: lake.append("quarantine", below(source.read("quarantine"), position)),
    ]
    with lake.fenced(0, archive):
        side_by_side(writes)
        lake.append("archives", spark.createDataFrame([row], TABLES["archives"].ddl))
    views = [lambda v=v: lake.append(v, batch(v)) for v in VIEWS if TABLES[v].stored]
    with lake.fenced(0, {"batch_id": 0, "end_offsets": archive["end_offsets"]}):
        side_by_side(views)
        lake.commit_batch(
            0,
            {
                "end_offsets": archive["end_offsets"],
                "events_read": int(acct["records"] or 0),
                "applied": int(acct["applied"] or 0),
                "duplicates": int(acct["duplicates"] or 0),
                "quarantined": int((acct["quarantined"] or 0) + (acct["rejected"] or 0)),
                "received_hist": "{}",
                "visible_at": int(time.time() * 1000),
                "phases": {"seeded_from": batch_namespace, "run_id": meta.get("run_id")},
            },
        )
    log.info("seeded %s from %s at %s", namespace, batch_namespace, position)
    return position


def dedup_memory(
    bronze: DataFrame, settings: Settings, partition: str
) -> tuple[DataFrame, DataFrame, DataFrame]:
    """The dedup memory at the archive's position, as contract/redis_functions/dedup.lua keeps it
    (docs/views.md, "Duplicates"), with the partition column named ``partition``: each partition's
    newest received_time (``hwm``); each id without a sequence with its newest received_time, for
    the ids within window + grace of hwm (``seen``); each writer's current run, for the writers
    with a record within window + grace of hwm (``writers``: hi, last, reorder and the seqs in
    (hi - R, hi] that arrived, space-separated)."""
    horizon = settings.dedup_window_ms + settings.dedup_grace_ms
    R = settings.dedup_reorder
    hwm = bronze.groupBy(F.col("partition").alias(partition)).agg(F.max("received_time").alias("hwm"))
    seen = (
        bronze.where(~F.col("event_id").rlike(SEQUENCED))
        .groupBy(F.col("partition").alias(partition), "event_id")
        .agg(F.max("received_time").alias("rt"))
        .join(hwm, partition)
        .where(F.col("rt") >= F.col("hwm") - horizon)
    )
    runs = writer_runs(
        bronze.select("partition", "offset", "event_id", "received_time"),
        settings.dedup_window_ms,
        settings.dedup_grace_ms,
    ).withColumnRenamed("partition", partition)
    current = runs.groupBy(partition, "writer").agg(F.max("run").alias("run"))
    writers = (
        runs.join(current, [partition, "writer", "run"])
        .groupBy(partition, "writer")
        .agg(
            F.max("seq").alias("hi"),
            F.max("received_time").alias("last"),
            F.collect_list("seq").alias("all_seqs"),
        )
        .join(hwm, partition)
        .where(F.col("last") >= F.col("hwm") - horizon)
        .select(
            partition,
            "writer",
            "hi",
            "last",
            F.lit(R).alias("reorder"),
            F.array_join(F.filter("all_seqs", lambda s: s > F.col("hi") - R), " ").alias("seqs"),
        )
    )
    return hwm, seen, writers


def restore(spark, settings: Settings, namespace: str, *, force: bool = False) -> dict:
    client = functions.connect(settings.redis_url)
    existing = next(iter(client.scan_iter(match=f"{namespace}:*", count=1000)), None)
    if existing is not None:
        if not force:
            raise RestoreError(
                f"Redis already holds keys of {namespace!r} (e.g. {existing!r}); --force drops them"
            )
        functions.drop_namespace(client, namespace)
    lake = Lake(spark, settings.lake_dir, namespace)
    record = lake.last_batch() if lake.exists() else None
    if record is None:
        raise RestoreError(
            f"no compacted views for {namespace!r} under {settings.lake_dir}: nothing to restore"
        )
    if settings.serving_layout == "partitioned":
        return restore_partitioned(client, lake, record, settings, namespace)
    functions.ensure_loaded(client)
    t0 = time.time()
    v = record.versions
    ends = record.end_offsets

    def at(table: str):
        return lake.read(table, v[table])

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
    # the latest N and no slack, which the keyed timelines allow (one that falls below N is refilled
    # from the posts)
    load(
        "T", derived.read(lake, "home_timeline", v, settings), "user_id", "post_id", "event_time", "author_id"
    )
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
    bronze = below(at("events_bronze"), ends)
    erased = bronze.where((F.col("type") == "user_erased") & (F.col("disposition") == "applied"))
    load("E", erased.select("user_id").distinct(), "user_id")

    # the dedup memory, as the Redis function keeps it (:func:`dedup_memory`)
    hwm, seen, writers = dedup_memory(bronze, settings, "partition")
    load("H", hwm, "partition", "hwm")
    load("D", seen, "partition", "event_id", "rt")
    load("W", writers, "partition", "writer", "hi", "last", "reorder", "seqs")

    cl = below(at("changelog"), ends)
    names = F.create_map(*[F.lit(x) for kv in {"a": "applied", "d": "duplicates", "r": "rejected",
                                                  "q": "quarantined"}.items() for x in kv])  # fmt: skip
    stats = cl.groupBy("partition", names[F.col("disposition")].alias("field")).count()
    load("X", stats, "partition", "field", "count")
    seq = _one_row(cl.agg(F.max("seq")))[0] or 0
    # every sequence number archived so far stays below the next one Redis hands out
    archived = _one_row(lake.read("archives").agg(F.max("seq")))[0] or 0
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


# --- the partitioned layout (docs/architecture.md, "The partitioned layout") ----------------------


def _partition_of(col, partitions: int):
    """:func:`contract.serving.partition_of` as a Spark column: CRC-32 of the id's decimal bytes."""
    return F.pmod(F.crc32(F.col(col).cast("string")), F.lit(partitions)).cast("int")


def _pwrite(client: redis.Redis, namespace: str, kind: str, df, partitions: int) -> int:
    """Rows of one kind (column ``q``: the partition, then the protocol's fields in order) through
    ``p_restore``, ROWS_PER_CALL per call, each call over the keys of its partition."""
    names = functions.protocol()["restore_rows"][kind]
    chunks: dict[int, list] = {q: [] for q in range(partitions)}
    pipe = client.pipeline(transaction=False)
    n = 0

    def flush(q: int) -> None:
        if chunks[q]:
            head = [namespace, q, kind, len(names)]
            pipe.fcall("p_restore", 1, functions.pkey(namespace, q, "fence"), *head, *chunks[q])
            chunks[q] = []

    for row in df.select("q", *names).toLocalIterator():
        q = int(row[0])
        chunks[q] += ["" if v is None else str(int(v)) if isinstance(v, bool) else str(v) for v in row[1:]]
        n += 1
        if len(chunks[q]) >= ROWS_PER_CALL * len(names):
            flush(q)
            if len(pipe) >= 20:
                pipe.execute()
    for q in chunks:
        flush(q)
    pipe.execute()
    return n


def restore_partitioned(client: redis.Redis, lake: Lake, record, settings: Settings, namespace: str) -> dict:
    """Each partition's keys at the compacted views' position P (whole: every delivery caused below
    P applied), written by ``p_restore``: the facts each partition owns (its users' profiles,
    statuses, follows, posts, inboxes, unread counters; ``lfol`` and ``celebs`` from the follows of
    its users), every author's replica of the latest N + S live posts in every partition, the
    timelines at their latest N over the sources stored in that partition (the authors at or below
    the threshold among its users, and the user), the erased users (``erased`` in their own
    partition, ``gone`` in all), the dedup memory, the statistics, then ``dfence`` and the fence at P,
    which leave a mark: P is the archiver's settled cut to go on from."""
    from pyspark.sql import Window

    from pipelines.speed.processor import ProcessorConfig

    t0 = time.time()
    v, ends = record.versions, record.end_offsets
    n = len(ends)
    if sorted(ends) != list(range(n)):
        raise RestoreError(f"{namespace!r}: the views' position {ends} does not name every partition")
    functions.ensure_partitioned_loaded(client)
    spark = lake.spark
    N, S, T = settings.timeline_length, ProcessorConfig("", "").timeline_slack, settings.fanout_threshold

    def at(table: str):
        return lake.read(table, v[table])

    def owned(df, col):
        return df.withColumn("q", _partition_of(col, n))

    every = spark.range(n).select(F.col("id").cast("int").alias("q"))
    counts: dict[str, int] = {}

    def load(kind: str, df, **renames) -> None:
        counts[kind] = _pwrite(
            client,
            namespace,
            kind,
            df.select(*[F.col(c).alias(a) for a, c in renames.items()], "q") if renames else df,
            n,
        )

    users = owned(at("users"), "user_id")
    load("U", users, user="user_id", handle="handle", display_name="display_name")
    load("S", owned(at("user_status"), "user_id"), user="user_id", text="text", event_time="event_time")
    follows = owned(at("follows"), "user_id")
    load("F", follows, user="user_id", followee="followee_id")
    celebs = follows.groupBy("q", "followee_id").count().where(F.col("count") > T)
    load("C", celebs, author="followee_id")
    posts = owned(at("posts"), "author_id").withColumn("deleted", F.col("deleted").cast("int"))
    load(
        "P",
        posts,
        author="author_id",
        post_id="post_id",
        event_time="event_time",
        text="text",
        deleted="deleted",
    )
    newest = Window.partitionBy("author_id").orderBy(F.desc("event_time"), F.desc("post_id"))
    live = posts.where(F.col("deleted") == 0).withColumn("k", F.row_number().over(newest))
    replica = live.where(F.col("k") <= N + S).withColumnRenamed("q", "home").crossJoin(every)
    replica = replica.withColumn("own", (F.col("home") == F.col("q")).cast("int"))
    load("R", replica, author="author_id", post_id="post_id", event_time="event_time", text="text", own="own")
    # the timelines: the latest N over the sources stored in the user's partition
    fanned = follows.join(celebs.select("q", "followee_id"), ["q", "followee_id"], "left_anti")
    sources = fanned.select("user_id", F.col("followee_id").alias("author_id")).unionByName(
        live.select(F.col("author_id").alias("user_id"), "author_id").distinct()
    )
    latest = live.where(F.col("k") <= N).select("author_id", "post_id", "event_time")
    order = Window.partitionBy("user_id").orderBy(
        F.desc("event_time"), F.desc("post_id"), F.desc("author_id")
    )
    timelines = owned(
        sources.join(latest, "author_id").withColumn("r", F.row_number().over(order)).where(F.col("r") <= N),
        "user_id",
    )
    load("T", timelines, user="user_id", post_id="post_id", event_time="event_time", author="author_id")
    inbox = owned(at("inbox"), "recipient_id").withColumn("read", F.col("read").cast("int"))
    load(
        "I", inbox, recipient="recipient_id", message_id="message_id", sender="sender_id", text="text",
        event_time="event_time", read="read",
    )  # fmt: skip
    load("N", owned(at("unread_counts"), "user_id"), user="user_id", unread="unread")

    # the erased users (their applied user_erased events below P): `erased` where their events are,
    # `gone` everywhere (every erasure delivery below P is applied)
    bronze = below(at("events_bronze"), ends)
    erased = bronze.where((F.col("type") == "user_erased") & (F.col("disposition") == "applied"))
    load("E", erased.select("user_id", F.col("partition").alias("q")).distinct(), user="user_id")
    load("G", erased.select("user_id").distinct().crossJoin(every), user="user_id")
    # the dedup memory, per partition, as p_apply keeps it (:func:`dedup_memory`)
    hwm, seen, writers = dedup_memory(bronze, settings, "q")
    load("H", hwm, hwm="hwm")
    load("D", seen, event_id="event_id", received_time="rt")
    load("W", writers, writer="writer", hi="hi", last="last", reorder="reorder", seqs="seqs")
    # the statistics: the events' dispositions below P (a delivery's row has no offset)
    cl = below(at("changelog"), ends)
    names = F.create_map(*[F.lit(x) for kv in {"a": "applied", "d": "duplicates", "r": "rejected",
                                                  "q": "quarantined"}.items() for x in kv])  # fmt: skip
    stats = cl.groupBy(F.col("partition").alias("q"), names[F.col("disposition")].alias("field")).count()
    load("X", stats, field="field", count="count")
    position = spark.createDataFrame(
        [(q, s, o) for q in range(n) for s, o in ends.items()], "q int, source int, offset long"
    )
    load("Z", position)
    load("Y", spark.createDataFrame([(q, o) for q, o in ends.items()], "q int, offset long"))  # last
    log.info("restored %s at %s in %.1fs: %s", namespace, ends, time.time() - t0, counts)
    return {
        "namespace": namespace,
        "layout": "partitioned",
        "position": {str(p): o for p, o in ends.items()},
        "batch_id": record.batch_id,
        "rows": counts,
        "seconds": round(time.time() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    from pipelines.spark import build_spark

    p = argparse.ArgumentParser(prog=command_name("pipelines.restore"), description=__doc__.splitlines()[0])
    p.add_argument("--namespace", help="keyed state to restore (default: the active one)")
    p.add_argument("--force", action="store_true", help="drop the namespace's keys in Redis first")
    p.add_argument(
        "--from-batch",
        metavar="BATCH_NS",
        help="first write the (new) namespace's Delta tables from these batch views, then restore",
    )
    args = p.parse_args(argv)
    logs.configure("restore")
    settings = get_settings()
    namespace = args.namespace or namespaces.active(settings)
    redis_client(settings.redis_url, "probe").ping()  # a Redis that does not answer, before Spark's start
    spark = build_spark(f"restore-{namespace}", settings)
    try:
        if args.from_batch:
            if namespace == namespaces.active(settings):
                raise RestoreError(f"{namespace!r} is the live namespace; seed a new one")
            seed_from_batch(spark, settings, namespace, args.from_batch)
        print(json.dumps(restore(spark, settings, namespace, force=args.force), indent=2))
    except RestoreError as exc:
        print(f"restore: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "pipelines.restore"))
