"""Start the analytics queries: one Spark Structured Streaming query per output, one driver.

The log is read and parsed once: the ``events`` query reads ``social.events`` from Kafka, keeps
the contract-valid events (the project's one contract parse, :mod:`pipelines.analytics.source`)
and appends them to the Delta table ``analytics/events``; every output query streams from that
table. Parsing is most of a query's cost (measured: ~130 µs of CPU per record on two cores, a
bare Kafka read ~60 µs), and nine queries each reading and parsing the log needed more than the
two cores at 2,000 events/s; the price is one more trigger interval of latency.

``python -m pipelines.analytics [--only NAME ...] [--available-now]``; ``make up`` runs it in the
background (log: ``var/log/analytics.log``) unless ``SOCIAL_ANALYTICS=0``. Every finished
micro-batch of every query is one JSON line (Spark's ``StreamingQueryProgress``: durations, rows,
offsets, state store size) in ``var/log/analytics-progress-<namespace>.jsonl``.

Off the serving path: the process sets ``nice 10`` (``SOCIAL_OFF_PATH_NICE``) on itself before
its JVM starts, as the archiver does, so when the speed layer and the analytics both want the two
cores the speed layer gets them and the analytics' windows close a little later instead
(docs/architecture.md, "The stream analytics").

"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener

from contract import namespaces
from infra import clients, logs
from infra.cli import command_name, run_main
from infra.settings import Settings, get_settings
from pipelines.analytics import joins, rules, source, windows
from pipelines.analytics.config import AnalyticsConfig
from pipelines.stopping import stop_requested

log = logging.getLogger("analytics")

WINDOW_QUERIES: dict[str, Callable[[DataFrame, AnalyticsConfig], DataFrame]] = {
    "activity_per_minute": windows.activity_per_minute,
    "active_users": windows.active_users,
    "sessions": windows.sessions,
    "message_reads": joins.message_reads,
}
QUERIES = (*WINDOW_QUERIES, "late_events", "posts_enriched", *rules.RULES)
ALERTS_DDL = (
    "alert_id STRING, rule STRING, user_id BIGINT, window_start TIMESTAMP, window_end TIMESTAMP, "
    "value BIGINT, threshold BIGINT, event_ids ARRAY<STRING>, last_received_time BIGINT, "
    "raised_at BIGINT, batch_id BIGINT"
)


@dataclass(frozen=True)
class Paths:
    """Where one namespace's analytics keep their tables and checkpoints."""

    lake: Path
    checkpoints: Path

    @classmethod
    def for_namespace(cls, settings: Settings, namespace: str) -> Paths:
        return cls(
            lake=settings.lake_dir / namespace / "analytics",
            checkpoints=Path(settings.var_dir) / "checkpoints" / namespace / "analytics",
        )

    def table(self, name: str) -> str:
        return str(self.lake / name)

    def checkpoint(self, name: str) -> str:
        return str(self.checkpoints / name)


def _fenced_append(df: DataFrame, path: str, app_id: str, batch_id: int) -> None:
    df.write.format("delta").mode("append").option("txnAppId", app_id).option(
        "txnVersion", str(batch_id)
    ).save(path)


def _read_or_empty(spark, path: Path, ddl: str) -> DataFrame:
    if (path / "_delta_log").exists():
        return spark.read.format("delta").load(str(path))
    return spark.createDataFrame([], ddl)


class LateEventsSink:
    """``foreachBatch``: the batch's late events (see :mod:`pipelines.analytics.windows`)."""

    def __init__(self, paths: Paths, cfg: AnalyticsConfig, app_id: str):
        self.paths, self.cfg, self.app_id = paths, cfg, app_id

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        # Read the whole batch once, whatever is late in it: Spark takes the batch's largest event
        # time (hence the next watermark) from the rows this plan actually produced.
        batch = batch.localCheckpoint(eager=True)
        chk = Path(self.paths.checkpoint("late_events"))
        closed = windows.batch_watermark_ms(chk, batch_id - 1) if batch_id > 0 else 0
        newest = windows.batch_watermark_ms(chk, batch_id) + self.cfg.lateness_ms
        late = windows.late_in_batch(batch, closed, newest).withColumn("batch_id", F.lit(batch_id))
        if closed and not late.isEmpty():
            _fenced_append(late, self.paths.table("late_events"), self.app_id, batch_id)


class PostsEnrichedSink:
    """``foreachBatch``: posts joined with the speed layer's ``users`` and ``user_status`` views."""

    def __init__(self, paths: Paths, views_root: Path, app_id: str):
        self.paths, self.views_root, self.app_id = paths, views_root, app_id

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        users_path = self.views_root / "users"
        users = _read_or_empty(spark, users_path, "user_id BIGINT, handle STRING")
        status = _read_or_empty(spark, self.views_root / "user_status", "user_id BIGINT, text STRING")
        version = _latest_version(users_path)
        out = joins.enrich_posts(batch, users, status).withColumn(
            "views_version", F.lit(version).cast("bigint")
        )
        if not out.isEmpty():
            _fenced_append(out, self.paths.table("posts_enriched"), self.app_id, batch_id)


def _latest_version(table: Path) -> int | None:
    from pipelines.lake import latest_version

    return latest_version(table)


class AlertSink:
    """``foreachBatch`` of a rule (update mode): alerts not raised before -> Kafka, then Delta."""

    def __init__(self, paths: Paths, app_id: str, kafka: tuple[dict[str, str], str] | None):
        """``kafka``: the Kafka sink's options (``clients.spark_kafka_options``) and the alerts topic."""
        self.paths, self.app_id, self.kafka = paths, app_id, kafka

    def raised(self, batch: DataFrame) -> DataFrame | None:
        """The ids of the alerts already raised that ``batch`` could repeat; None if it is empty.

        An alert's id names its window, so only alerts of the batch's windows can repeat: the read
        is bounded to their ``window_start`` range, which Delta's file statistics turn into a scan
        of the few files appended while those windows were open, not of every alert ever raised.
        """
        bounds = batch.agg(F.min("window_start"), F.max("window_start")).first()
        assert bounds is not None  # an aggregate without a grouping has one row
        lo, hi = bounds
        if lo is None:
            return None
        return (
            batch.sparkSession.read.format("delta")
            .load(self.paths.table("alerts"))
            .where(F.col("window_start").between(lo, hi))
            .select("alert_id")
        )

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        batch = batch.localCheckpoint()  # read once: the window range, then the anti-join
        raised = self.raised(batch)
        if raised is None:
            return
        new = (
            batch.join(raised, "alert_id", "left_anti")
            .withColumn("raised_at", F.lit(int(time.time() * 1000)).cast("bigint"))
            .withColumn("batch_id", F.lit(batch_id).cast("bigint"))
            .select(*[c.split()[0] for c in ALERTS_DDL.split(", ")])
            .localCheckpoint()
        )
        if new.isEmpty():
            return
        if self.kafka is not None:
            options, topic = self.kafka
            value = F.to_json(F.struct(*[F.col(c) for c in new.columns]))
            (
                new.select(F.col("alert_id").alias("key"), value.alias("value"))
                .write.format("kafka")
                .options(**options)
                .option("topic", topic)
                .save()
            )
        _fenced_append(new, self.paths.table("alerts"), self.app_id, batch_id)


class ProgressLog(StreamingQueryListener):
    """Appends every query's progress, one JSON object per finished micro-batch, to ``path``.

    The file is how a person (``tail -f``) and the ``analytics`` benchmark watch the queries run
    in another process: batch durations, input rows, the Kafka offsets read, state rows and bytes.
    """

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()

    @staticmethod
    def path_for(settings: Settings, namespace: str) -> Path:
        return Path(settings.log_dir) / f"analytics-progress-{namespace}.jsonl"

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        line = json.dumps(json.loads(event.progress.json), separators=(",", ":"))
        with self._lock, self.path.open("a") as f:
            f.write(line + "\n")

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass


EVENTS = "events"  # the one query that reads and parses the log; the outputs read its table


def _trigger(writer, trigger: str | None):
    return writer.trigger(availableNow=True) if trigger is None else writer.trigger(processingTime=trigger)


def start_events(
    spark, records: Callable[[], DataFrame], paths: Paths, trigger: str | None
) -> StreamingQuery:
    """The log read and parsed once: contract-valid events (with ``event_ts``) appended to Delta.

    The table is created empty first, so the output queries can start reading it at once.
    """
    events = source.events(records())
    table = paths.table(EVENTS)
    spark.createDataFrame([], events.schema).write.format("delta").mode("ignore").save(table)
    writer = (
        events.writeStream.format("delta")
        .outputMode("append")
        .option("path", table)
        .option("checkpointLocation", paths.checkpoint(EVENTS))
        .queryName(f"analytics_{EVENTS}")
    )
    return _trigger(writer, trigger).start()


def read_the_log_directly(paths: Paths, names: tuple[str, ...]) -> list[str]:
    """The output queries whose checkpoint was written when every query read Kafka itself.

    Such a checkpoint records Kafka offsets where the query now reads the ``events`` table (a
    Delta source, whose offsets carry a ``reservoirId``); Spark cannot resume it.
    """
    found = []
    for name in names:
        offsets = Path(paths.checkpoint(name)) / "offsets"
        batches = sorted((f for f in offsets.glob("*") if f.name.isdigit()), key=lambda f: int(f.name))
        if batches and "reservoirId" not in batches[-1].read_text().splitlines()[-1]:
            found.append(name)
    return found


def parsed_events(spark, paths: Paths) -> DataFrame:
    """The stream every output query reads: the table :func:`start_events` appends to."""
    return spark.readStream.format("delta").load(paths.table(EVENTS))


def start(
    spark,
    events: Callable[[], DataFrame],
    paths: Paths,
    cfg: AnalyticsConfig,
    *,
    names: tuple[str, ...] = QUERIES,
    namespace: str = "v1",
    views_root: Path | None = None,
    kafka: tuple[dict[str, str], str] | None = None,
    trigger: str | None,
) -> list[StreamingQuery]:
    """Start the named queries over ``events()``: contract-valid events with ``event_ts``
    (:func:`parsed_events` when live, or a test's file stream through :func:`source.events`).

    ``trigger=None``: available-now (process what is in the log, then stop).
    """
    unknown = sorted(set(names) - set(QUERIES))
    if unknown:
        raise ValueError(f"unknown analytics queries {unknown}; known: {list(QUERIES)}")
    if any(n in rules.RULES for n in names):
        spark.createDataFrame([], ALERTS_DDL).write.format("delta").mode("ignore").save(paths.table("alerts"))
    started = []
    sink: LateEventsSink | PostsEnrichedSink | AlertSink
    for name in names:
        events_df = events()
        if name in WINDOW_QUERIES:
            writer = WINDOW_QUERIES[name](events_df, cfg).writeStream.format("delta").outputMode("append")
            writer = writer.option("path", paths.table(name))
        elif name == "late_events":
            sink = LateEventsSink(paths, cfg, f"analytics_late_events:{namespace}")
            writer = windows.with_watermark(events_df, cfg).writeStream.foreachBatch(sink)
        elif name == "posts_enriched":
            sink = PostsEnrichedSink(
                paths, views_root or paths.lake.parent, f"analytics_posts_enriched:{namespace}"
            )
            writer = events_df.where(F.col("type") == "post_created").writeStream.foreachBatch(sink)
        else:
            sink = AlertSink(paths, f"analytics_{name}:{namespace}", kafka)
            writer = rules.RULES[name](events_df, cfg).writeStream.outputMode("update").foreachBatch(sink)
        writer = writer.option("checkpointLocation", paths.checkpoint(name)).queryName(f"analytics_{name}")
        writer = _trigger(writer, trigger)
        started.append(writer.start())
    return started


def run(
    settings: Settings,
    *,
    namespace: str | None = None,
    topic: str | None = None,
    names: tuple[str, ...] = QUERIES,
    available_now: bool = False,
    max_offsets: int | None = None,
) -> None:
    """Run the analytics until SIGTERM/SIGINT (``available_now``: until every query caught up)."""
    from infra.kafka_admin import require_kafka
    from infra.stack import create_topic
    from pipelines.spark import build_spark
    from pipelines.stream_progress import ProgressFile, progress_dir

    namespace = namespace or namespaces.active(settings)
    topic = topic or settings.events_topic
    paths = Paths.for_namespace(settings, namespace)
    stale = read_the_log_directly(paths, names)
    if stale:
        raise SystemExit(
            f"analytics: the checkpoints of {stale} under {paths.checkpoints} were written by the "
            "earlier design, where every query read the log itself; now one query parses the log "
            "and the others read its table, and Spark cannot resume those checkpoints. Rebuild the "
            f"analytics from the log: stop them, remove {paths.checkpoints} and {paths.lake}, start again."
        )
    require_kafka(settings)  # before the JVM's start, not 30 s after it
    spark = build_spark(f"analytics-{namespace}", settings)
    spark.streams.addListener(ProgressLog(ProgressLog.path_for(settings, namespace)))
    spark.streams.addListener(ProgressFile(progress_dir(settings)))  # for the metrics exporter
    create_topic(settings, settings.alerts_topic, 4)
    trigger = None if available_now else settings.analytics_trigger_interval
    parse = start_events(
        spark, lambda: source.kafka_records(spark, settings, topic, max_offsets), paths, trigger=trigger
    )
    if available_now:  # the outputs read what the parse wrote: all of it, before they start
        parse.awaitTermination()
        if (error := parse.exception()) is not None:
            raise error
    queries = [parse] + start(
        spark,
        lambda: parsed_events(spark, paths),
        paths,
        AnalyticsConfig.from_settings(settings),
        names=names,
        namespace=namespace,
        views_root=settings.lake_dir / namespace,
        kafka=(clients.spark_kafka_options(settings), settings.alerts_topic),
        trigger=trigger,
    )
    log.info("analytics running: namespace=%s topic=%s queries=%s", namespace, topic, ",".join(names))
    try:
        with stop_requested() as stopping:
            while any(q.isActive for q in queries) and not stopping.is_set():
                for q in queries:
                    if not q.isActive and (error := q.exception()) is not None:
                        raise error
                time.sleep(0.5)
    finally:
        # A batch interrupted here is re-run from the checkpoint at the next start (every sink is
        # fenced by batch id), so stopping in the middle of one is safe.
        for q in queries:
            try:
                q.stop()
            except Exception as exc:  # noqa: BLE001 - stopping the others matters more
                log.warning("stopping %s: %s", q.name, exc)
    if not stopping.is_set():
        failed = [error for q in queries if (error := q.exception()) is not None]
        if failed:
            raise failed[0]
    log.info("analytics stopped")
    spark.stop()


def main(argv: list[str] | None = None) -> int:
    from pipelines.spark import run_behind_serving_path

    p = argparse.ArgumentParser(prog=command_name("pipelines.analytics"), description=__doc__.splitlines()[0])
    p.add_argument("--namespace", help="lake namespace to write under (default: the active one)")
    p.add_argument("--topic", help="event topic (default: SOCIAL_EVENTS_TOPIC)")
    p.add_argument("--only", action="append", choices=QUERIES, help="run only this query (repeatable)")
    p.add_argument("--available-now", action="store_true", help="process what is in the log, then stop")
    p.add_argument("--max-offsets", type=int, help="records per micro-batch (default: the speed layer's)")
    args = p.parse_args(argv)
    run_behind_serving_path()  # after the arguments (--help changes nothing), before the JVM: it inherits it
    logs.configure("analytics")
    run(
        get_settings(),
        namespace=args.namespace,
        topic=args.topic,
        names=tuple(args.only or QUERIES),
        available_now=args.available_now,
        max_offsets=args.max_offsets,
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "pipelines.analytics"))
