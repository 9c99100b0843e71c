"""Joins on the event stream: stream-table (posts + their author's profile) and stream-stream
(each ``message_sent`` with its ``message_read`` within 24 hours).

- ``posts_enriched``: each ``post_created`` with its author's handle and *current* status: the
  speed layer's Delta views ``users`` and ``user_status`` of the live namespace, read at their
  latest version when the micro-batch runs (a KTable join: the table as of processing time, not
  as of the post's event time). ``views_version`` says which version of ``users`` it saw.
- ``message_reads``: a left-outer time-interval join: the read must come from the recipient,
  at an event time within ``[sent, sent + 24 h]``. A read message is emitted as soon as both
  sides are in; an unread one when the watermark passes sent + 24 h (``read_ts`` null,
  ``read_within_24h`` false): the unread-after-24h count. The time-to-read distribution per hour
  of sending is :func:`time_to_read_per_hour` over that table.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.analytics.config import AnalyticsConfig

# time-to-read buckets of the per-hour distribution: upper bounds in seconds (the last: 24 h)
TTR_BUCKETS_S = (10, 60, 300, 1800, 3600, 6 * 3600, 24 * 3600)


def message_reads(events: DataFrame, cfg: AnalyticsConfig) -> DataFrame:
    # one watermark for both sides, declared before the split: any event advances it; a record
    # sent twice (a client's retry: the same event_id) is one message and one read, not two rows
    events = events.withWatermark("event_ts", cfg.lateness).dropDuplicatesWithinWatermark(["event_id"])
    sent = events.where(F.col("type") == "message_sent").select(
        "message_id",
        F.col("user_id").alias("sender_id"),
        "recipient_id",
        F.col("event_ts").alias("sent_ts"),
        F.col("event_time").alias("sent_time"),
    )
    read = events.where(F.col("type") == "message_read").select(
        F.col("message_id").alias("read_message_id"),
        F.col("user_id").alias("reader_id"),
        F.col("event_ts").alias("read_ts"),
        F.col("event_time").alias("read_time"),
    )
    on = F.expr(
        "read_message_id = message_id AND reader_id = recipient_id AND read_ts >= sent_ts "
        f"AND read_ts <= sent_ts + INTERVAL {cfg.read_within_h} HOURS"
    )
    return sent.join(read, on, "leftOuter").select(
        "message_id",
        "sender_id",
        "recipient_id",
        "sent_ts",
        "read_ts",
        (F.col("read_time") - F.col("sent_time")).alias("time_to_read_ms"),
        F.col("read_ts").isNotNull().alias("read_within_24h"),
    )


def time_to_read_per_hour(reads: DataFrame) -> DataFrame:
    """Per hour of sending: messages, read within 24 h, unread after 24 h, and a histogram of
    time to read (``le_<seconds>`` counts, cumulative) with its median. A batch view over
    ``message_reads`` (the report and the quality suites read it)."""
    ttr_s = F.col("time_to_read_ms") / 1000
    buckets = [F.sum(F.when(ttr_s <= b, 1).otherwise(0)).alias(f"le_{b}s") for b in TTR_BUCKETS_S]
    return (
        reads.groupBy(F.date_trunc("hour", "sent_ts").alias("hour"))
        .agg(
            F.count("*").alias("messages"),
            F.sum(F.col("read_within_24h").cast("int")).alias("read"),
            F.sum((~F.col("read_within_24h")).cast("int")).alias("unread_after_24h"),
            F.percentile_approx("time_to_read_ms", 0.5).alias("median_time_to_read_ms"),
            *buckets,
        )
        .orderBy("hour")
    )


def enrich_posts(posts: DataFrame, users: DataFrame, status: DataFrame) -> DataFrame:
    """Posts with their author's handle and status text (null when the views do not know them)."""
    u = users.select(F.col("user_id").alias("author_id"), "handle")
    s = status.select(F.col("user_id").alias("author_id"), F.col("text").alias("author_status"))
    return (
        posts.where(F.col("type") == "post_created")
        .select(F.col("user_id").alias("author_id"), "post_id", "event_ts", "text")
        .join(u, "author_id", "left")
        .join(s, "author_id", "left")
        .select("post_id", "author_id", "event_ts", "handle", "author_status", "text")
    )
