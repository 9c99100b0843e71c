"""The archiver: the keyed speed layer's changelog and the raw log into Delta, off the serving path.

A process of its own beside the speed layer, at a lower CPU priority (it sets ``nice 10``,
``SOCIAL_OFF_PATH_NICE``, on itself at start; its JVM inherits it), so the serving path keeps the
cores when both want them. Every ``SOCIAL_ARCHIVE_INTERVAL_S`` while records flow, and at once
when the speed layer is idle at the log's end, it archives one consistent cut of the keyed state
(:func:`pipelines.speed.changelog.cut`, read atomically from Redis), with one fenced Delta append
per table (docs/architecture.md, "Where state lives"):

- ``changelog``: every record's disposition, reason, sequence number and view changes;
- ``events_bronze``: every contract-valid record with the disposition the speed layer gave it,
  parsed from the raw Kafka records of the same offsets (the archive the batch layer and the
  analysts read);
- ``quarantine``: every record the speed layer quarantined or rejected, with its reason and raw
  value;
- ``archives``: one row, written last, with the range the append covers and its accounting.

Exactly once: each append is Delta's idempotent write (``txnAppId`` = ``archiver:<ns>``,
``txnVersion`` = the archive id) carrying the range in its commit metadata. After a crash the
archiver finds the range of an unfinished archive in the commits it left and re-runs exactly that
range; the tables that committed it skip the write. Only then are the Redis changelog streams
trimmed up to what Delta holds (and no further than the compacted topics' publisher got,
:mod:`pipelines.speed.compacted`), so Redis keeps the tail alone.

Durability: Redis persists with ``appendfsync everysec`` and may lose its last ~2 s in a crash
(then its fences and state roll back together and the speed layer re-applies). The archiver only
archives a cut at least ``SOCIAL_ARCHIVE_DURABILITY_S`` old, so what Delta holds is never ahead
of what Redis can come back with.

Each cycle it also commits the speed layer's fences and its own position as Kafka consumer-group
offsets (``social.speed-layer.<ns>``, ``social.archiver.<ns>``), so ``kafka-consumer-groups``
shows both lags. Every ``SOCIAL_COMPACTION_INTERVAL_S``, and at once when the log goes quiet (nothing
new to archive, and the speed layer's fences at the log's end: a speed layer restarting with
records still to read is a pause, not a quiet log), it also compacts the archive into the Delta
views (:mod:`pipelines.compaction`). Run: ``python -m pipelines.archiver [--once]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from tenacity import Retrying, before_sleep_log, stop_after_attempt, wait_exponential

from contract import functions, namespaces
from infra import logs
from infra.cli import command_name, run_main
from infra.settings import Settings, get_settings
from pipelines.lake import Archive, Lake, archived, covers, latest_metadata, location, side_by_side
from pipelines.parse import parse_records, received_date
from pipelines.speed import changelog
from pipelines.speed.stream import commit_positions
from pipelines.stopping import stop_requested
from pipelines.tables import TABLES

log = logging.getLogger("archiver")

DATA_TABLES = ("changelog", "events_bronze", "quarantine")
ARCHIVER_ATTEMPTS = 8  # ~2 min of backoff before a step that keeps failing stops the archiver
BRONZE_DISPOSITION = {"a": "applied", "d": "duplicate", "r": "rejected"}
CHANGELOG_DDL = "partition INT, offset BIGINT, seq BIGINT, disposition STRING, reason STRING, changes STRING"


def unfinished(lake_dir: Path, namespace: str, after: Archive | None) -> Archive | None:
    """An archive some data table committed but ``archives`` did not: a crash in the middle."""
    want = 0 if after is None else after.archive_id + 1
    for table in DATA_TABLES:
        m = latest_metadata(location(lake_dir) / namespace / table, "archive_id")
        if m and int(m["archive_id"]) == want:
            return Archive.from_metadata(m)
    return None


def next_range(
    client: redis.Redis, namespace: str, done: Archive | None, cut: changelog.Cut, partitioned: bool = False
) -> Archive | None:
    """The records from the last archive up to ``cut``; None when there is nothing new."""
    start = {}
    for p in cut.fences:
        if done is not None and p in done.end_offsets:
            start[p] = done.end_offsets[p]
        elif partitioned:  # a partition new to the archive: from the log's start (no seeded state yet)
            start[p] = 0
        else:  # a partition new to the archive: from its oldest changelog entry
            first = changelog.first_offset(client, namespace, p)
            start[p] = cut.fences[p] if first is None else first
    behind = {p: (cut.fences[p], start[p]) for p in cut.fences if cut.fences[p] < start[p]}
    if behind:
        # Redis came back from an older state than Delta holds (it lost more than the
        # durability lag): wait until the speed layer has re-applied up to the archive.
        log.warning("Redis fences behind the archive (fence, archived): %s; waiting", behind)
        return None
    if all(cut.fences[p] == start[p] for p in cut.fences):
        return None
    return Archive(
        archive_id=0 if done is None else done.archive_id + 1,
        start_offsets=start,
        end_offsets=dict(cut.fences),
        seq=cut.seq,
    )


def raw_records(spark, settings: Settings, topic: str, a: Archive) -> DataFrame:
    """The Kafka records of the archive's range (one Spark task per partition)."""
    from pipelines.replay import read_range

    return read_range(spark, settings, topic, a.start_offsets, a.end_offsets)


def _arrow(rows: list[dict]):
    """Changelog rows as an Arrow table (to the JVM in columns, not row by row). The entries'
    timeline items (the fan-out, one per follower timeline) are not archived: ``home_timeline`` is
    derived from the facts (:mod:`pipelines.derived`)."""
    import pyarrow as pa

    schema = pa.schema(
        [("partition", pa.int32()), ("offset", pa.int64()), ("seq", pa.int64())]
        + [(c, pa.string()) for c in ("disposition", "reason", "changes")]
    )
    return pa.Table.from_pylist(rows, schema=schema)


class ArchiveGap(RuntimeError):
    """The changelog or the log lacks records of a range: the archive cannot be complete."""


def archive_once(
    spark, lake: Lake, client: redis.Redis, settings: Settings, topic: str, target
) -> Archive | None:
    """Archive up to the cut ``target`` (or re-run an unfinished archive); returns what it wrote."""
    partitioned = settings.serving_layout == "partitioned"
    done = archived(settings.lake_dir, lake.namespace)
    a = unfinished(settings.lake_dir, lake.namespace, done) or next_range(
        client, lake.namespace, done, target, partitioned
    )
    if a is None:
        return None
    t0 = time.time()
    log.info("archive %d: starting, offsets %s to %s", a.archive_id, a.start_offsets, a.end_offsets)
    rows = []
    for p, end in a.end_offsets.items():
        if partitioned:  # its events and the deliveries it applied, caused in the range
            got = changelog.read_partitioned(client, lake.namespace, p, a.start_offsets, a.end_offsets)
        else:
            got = changelog.read(client, lake.namespace, p, a.start_offsets[p], end)
        events = sum(r["disposition"] != "x" for r in got)
        if events != end - a.start_offsets[p]:
            raise ArchiveGap(
                f"partition {p}: {events} changelog entries for offsets "
                f"[{a.start_offsets[p]}, {end}) in Redis; expected {end - a.start_offsets[p]}"
            )
        rows += got
    cl = spark.createDataFrame(_arrow(rows)).withColumn("archive_id", F.lit(a.archive_id).cast("bigint"))
    cl = cl.localCheckpoint()
    events, parse_quarantine = parse_records(raw_records(spark, settings, topic, a))
    verdict = cl.select("partition", "offset", F.col("disposition").alias("_d"), F.col("reason").alias("_r"))
    bronze_map = F.create_map(*[F.lit(x) for kv in BRONZE_DISPOSITION.items() for x in kv])
    bronze = (
        events.join(verdict.where(F.col("_d").isin(*BRONZE_DISPOSITION)), ["partition", "offset"])
        .withColumn("disposition", bronze_map[F.col("_d")])
        .withColumn("reason", F.col("_r"))
        .withColumn("received_date", received_date())
        .select(*TABLES["events_bronze"].columns)
        .localCheckpoint()
    )
    # Quarantine: what the speed layer quarantined or rejected (its reason), and anything the
    # Spark parser refuses that the speed layer's parser accepted (kept, never dropped, labelled).
    q_cols = TABLES["quarantine"].columns
    fields = [c for c in q_cols if c != "reason"]
    base = events.select(*fields, F.lit(None).cast("string").alias("_parse")).unionByName(
        parse_quarantine.select(*fields, F.col("reason").alias("_parse"))
    )
    quarantine = (
        base.join(verdict, ["partition", "offset"])
        .where(F.col("_d").isin("q", "r") | F.col("_parse").isNotNull())
        .withColumn(
            "reason",
            F.when(F.col("_d").isin("q", "r"), F.col("_r")).otherwise(
                F.concat(F.lit("archive_parse_mismatch:"), F.col("_parse"))
            ),
        )
        .select(*q_cols)
        .localCheckpoint()
    )
    counts = Counter(r["disposition"] for r in rows)  # (x: a delivery's changes, not a record)
    records = len(rows) - counts.get("x", 0)
    # every record of the range lands in bronze or quarantine (a rejected one in both)
    covered = (
        bronze.select("partition", "offset")
        .union(quarantine.select("partition", "offset"))
        .distinct()
        .count()
    )
    if covered != records:
        raise ArchiveGap(
            f"archive {a.archive_id}: {records} changelog entries but {covered} records in bronze or "
            "quarantine: records missing from the log"
        )
    hist = {
        str(r["b"]): r["count"]
        for r in bronze.groupBy((F.col("received_time") / 100).cast("long").alias("b")).count().collect()
    }
    row = {
        "archive_id": a.archive_id,
        "start_offsets": json.dumps(a.metadata()["start_offsets"]),
        "end_offsets": json.dumps(a.metadata()["end_offsets"]),
        "seq": a.seq,
        "records": records,
        "applied": counts.get("a", 0),
        "duplicates": counts.get("d", 0),
        "rejected": counts.get("r", 0),
        "quarantined": counts.get("q", 0),
        "min_received": min((int(b) * 100 for b in hist), default=None),
        "max_received": max((int(b) * 100 for b in hist), default=None),
        "received_hist": json.dumps(hist),
        "archived_at": int(time.time() * 1000),
    }
    with lake.fenced(a.archive_id, a.metadata()):
        data = dict(zip(DATA_TABLES, (cl, bronze, quarantine), strict=True))
        side_by_side([lambda t=t, df=df: lake.append(t, df) for t, df in data.items()])
        lake.append("archives", spark.createDataFrame([row], TABLES["archives"].ddl))
    upto = a.end_offsets
    if settings.compacted_topics:  # nor what the compacted topics' publisher has not produced yet
        from pipelines.speed.compacted import position

        if partitioned:  # both settled cuts, of one chain: the earlier one
            published = position(client, lake.namespace, len(upto))
            published = {p: published.get(p, 0) for p in upto}
            upto = published if sum(published.values()) < sum(upto.values()) else upto
        else:
            published = position(client, lake.namespace)
            upto = {p: min(o, published.get(p, 0)) for p, o in upto.items()}
    changelog.trim(client, lake.namespace, upto, partitioned)
    log.info(
        "archive %d: %d records (%s) up to %s in %.2fs",
        a.archive_id,
        records,
        dict(counts),
        a.end_offsets,
        time.time() - t0,
    )
    return a


def applied_all(settings: Settings, topic: str, fences: dict[int, int]) -> bool:
    """Whether the speed layer's ``fences`` are at the end of every partition of ``topic``.

    A log the speed layer has not caught up with (it is restarting, or it crashed) is not quiet,
    however long nothing new reaches Redis: archiving and compacting at once then would be redone
    as soon as it reads on. A broker that does not answer at once makes it "no" (the intervals
    still archive and compact).
    """
    from infra.stack import end_offsets

    try:
        ends = end_offsets(settings, topic, timeout_s=2.0)
    except Exception:  # it only decides whether to compact now or at the interval
        log.debug("the log's end is unknown for now", exc_info=True)
        return False
    return covers(fences, ends)


@dataclass(frozen=True)
class Step:
    archive: changelog.Cut | None  # the cut to archive now, if any
    at_end: bool  # the speed layer idle at the log's end (what the durable cut holds is all there is)


@dataclass
class Schedule:
    """When the archiver archives and compacts: :func:`run`'s loop asks it once a tick.

    - It archives the newest cut at least ``durability_s`` old (what Redis is sure to come back
      with after a crash), every ``interval_s`` while the speed layer applies records, and at once
      when the speed layer is idle at the log's end: nothing applied since that cut, and its fences
      at every partition's end. A speed layer that stopped short (restarting, crashed) is a pause,
      not the end: it waits for the interval.
    - It compacts what was archived every ``compaction_interval_s``, and at once when the log is
      quiet: at its end, and nothing new to archive.

    Idle at the end and all compacted, a tick asks nothing of the broker (``at_end`` is asked only
    when there is something to archive or compact, and the speed layer is idle).
    """

    interval_s: float
    durability_s: float
    compaction_interval_s: float
    cuts: deque = field(default_factory=deque)  # (taken at, cut) of the last durability seconds
    handed: dict[int, int] | None = None  # the fences the last archive reached (or was asked for)
    last_archive: float = float("-inf")
    last_compaction: float = field(default_factory=time.monotonic)
    behind: bool = True  # archives not compacted yet (a previous run may have left some)

    def tick(self, now: float, cut: changelog.Cut, at_end: Callable[[dict[int, int]], bool]) -> Step:
        self.cuts.append((now, cut))
        while len(self.cuts) > 1 and now - self.cuts[1][0] >= self.durability_s:
            self.cuts.popleft()
        taken, durable = self.cuts[0]
        new = durable.fences != self.handed
        if now - taken < self.durability_s or not (new or self.behind):
            return Step(None, False)
        end = cut.fences == durable.fences and at_end(durable.fences)
        due = new and (end or now - self.last_archive >= self.interval_s)
        return Step(durable if due else None, end)

    def archived(self, now: float, asked: changelog.Cut, wrote: Archive | None) -> None:
        # a crashed run's unfinished archive is re-run first: it may end short of the cut asked for
        self.handed = wrote.end_offsets if wrote else asked.fences
        self.last_archive = now
        self.behind = self.behind or wrote is not None

    def compaction_due(self, now: float, step: Step) -> bool:
        quiet = step.at_end and step.archive is None
        return self.behind and (quiet or now - self.last_compaction >= self.compaction_interval_s)

    def compacted(self, now: float) -> None:
        self.last_compaction, self.behind = now, False


def cutter(
    settings: Settings, client: redis.Redis, namespace: str, topic: str
) -> Callable[[], changelog.Cut]:
    """What reads the newest consistent cut in the serving layout: the keyed layout's fences and
    sequence number, read atomically; the partitioned layout's newest position every partition
    marked (:class:`pipelines.speed.changelog.SettledCuts`)."""
    if settings.serving_layout != "partitioned":
        functions.ensure_loaded(client)
        return lambda: changelog.cut(client, namespace)
    from pipelines.speed.stream import topic_partitions

    functions.ensure_partitioned_loaded(client)
    return changelog.SettledCuts(client, namespace, len(topic_partitions(settings, topic)))


def run(
    settings: Settings, *, namespace: str | None = None, topic: str | None = None, once: bool = False
) -> None:
    """Archive and compact until stopped (``once``: archive what Redis holds now, compact, stop)."""
    from pipelines.compaction import compact_once
    from pipelines.spark import build_spark

    namespace = namespace or namespaces.active(settings)
    topic = topic or settings.events_topic
    client = functions.connect(settings.redis_url)
    cut = cutter(settings, client, namespace, topic)
    spark = build_spark(f"archiver-{namespace}", settings)
    lake = Lake(spark, settings.lake_dir, namespace, writer="archiver")
    lake.ensure_tables()
    compactor = Lake(spark, settings.lake_dir, namespace, writer="compaction")

    log.info("archiver running: namespace=%s topic=%s", namespace, topic)
    if once:
        archive_once(spark, lake, client, settings, topic, cut())
        compact_once(spark, compactor, settings)
        return
    # A failed step (the broker or Redis away for a moment, a Delta commit conflict) is retried
    # with backoff; one that keeps failing stops the archiver loudly. The fences make a retry safe.
    retry = Retrying(
        wait=wait_exponential(multiplier=1, max=30),
        stop=stop_after_attempt(ARCHIVER_ATTEMPTS),
        before_sleep=before_sleep_log(log, logging.WARNING, exc_info=True),
        reraise=True,
    )
    schedule = Schedule(
        settings.archive_interval_s, settings.archive_durability_s, settings.compaction_interval_s
    )
    committed: dict[str, dict[int, int]] = {}  # the positions last committed to Kafka
    tick = max(0.1, min(1.0, settings.archive_interval_s, settings.archive_durability_s))
    with stop_requested() as stopping:
        while not stopping.is_set():
            now = time.monotonic()
            step = schedule.tick(now, retry(cut), lambda f: applied_all(settings, topic, f))
            if step.archive is not None:
                wrote = retry(archive_once, spark, lake, client, settings, topic, step.archive)
                schedule.archived(now, step.archive, wrote)
                done = wrote or archived(settings.lake_dir, namespace)  # the last complete archive
                positions = {"speed-layer": step.archive.fences, "archiver": done.end_offsets if done else {}}
                # only when they moved (each commit is a short-lived Kafka client of its own)
                if positions != committed:
                    try:
                        commit_positions(settings, topic, namespace, positions)
                        committed = positions
                    except Exception:  # a monitoring aid only: never stops the archiver
                        log.warning("committing the positions to Kafka consumer groups failed", exc_info=True)
            if schedule.compaction_due(time.monotonic(), step):
                retry(compact_once, spark, compactor, settings)
                schedule.compacted(time.monotonic())
            stopping.wait(tick - (time.monotonic() - now))
    log.info("stopping")


def main(argv: list[str] | None = None) -> int:
    from pipelines.spark import run_behind_serving_path

    p = argparse.ArgumentParser(prog=command_name("pipelines.archiver"), description=__doc__.splitlines()[0])
    p.add_argument("--namespace", help="views version to archive (default: the active one)")
    p.add_argument("--topic", help="event topic (default: SOCIAL_EVENTS_TOPIC)")
    p.add_argument("--once", action="store_true", help="archive what Redis holds now, compact, and stop")
    args = p.parse_args(argv)
    run_behind_serving_path()  # after the arguments (--help changes nothing), before the JVM: it inherits it
    logs.configure("archiver")
    run(get_settings(), namespace=args.namespace, topic=args.topic, once=args.once)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "pipelines.archiver"))
