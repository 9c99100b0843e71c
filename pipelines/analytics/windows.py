"""Event-time windows over the event stream: tumbling, hopping, session; and the late events.

Every query here is a pure ``events stream -> rows`` function on Spark's built-in operators
(``window``, ``session_window``, ``approx_count_distinct``, a watermark of ``lateness`` on the
corrected event time); the runner (:mod:`pipelines.analytics.runner`) wires them to Kafka and
Delta. A window's row is written once, when the watermark closes it (append mode).

**What "late" means** (and what ``late_events`` counts). Micro-batch k of a query has a
watermark ``W_k`` = (the largest event time of its batches before k) - lateness, recorded in the
query's offset log. At the end of batch k, the windows ending at or before ``W_k`` are closed:
written out once and their state dropped. An event that arrives in batch k for a window closed
by an earlier batch (``window_end <= W_(k-1)``) can no longer be counted: Spark drops it
(since Spark 3.4 the late-row threshold of batch k is the previous batch's watermark). That
event is *late*. For ``activity_per_minute`` the window is the event's one-minute window, and
that is the rule ``late_events`` applies; a longer window (hopping, a session) ends later, so it
drops an event entirely only if that event is late by the one-minute rule too. Hence every event
a window query leaves out is counted in ``late_events``, per one-minute window of its event time
and type, with how far behind it came: ``behind_ms`` = (the largest event time seen before its
batch) - its event time = ``W_k`` + lateness - event time.

Every query declares the watermark on all events before it filters the types it needs, so all
of them advance their watermarks on the same events. Each query has its own micro-batches:
over Kafka, the late set of ``late_events`` and the events ``activity_per_minute`` drops agree
up to where each query's batches happened to end (in a replay with the same batches, exactly).
"""

from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.analytics.config import AnalyticsConfig

MINUTE = "1 minute"
ACTIVE_WINDOW, ACTIVE_SLIDE = "10 minutes", "1 minute"
SESSION_GAP = "5 minutes"
ACTIVITY_TYPES = ("post_created", "message_sent")
ACTIVE_USERS_RSD = 0.02


def _bounds(col: str = "window") -> list:
    return [F.col(f"{col}.start").alias("window_start"), F.col(f"{col}.end").alias("window_end")]


def activity_per_minute(events: DataFrame, cfg: AnalyticsConfig) -> DataFrame:
    """Posts and messages per event-time minute (tumbling): window, type, events."""
    return (
        events.withWatermark("event_ts", cfg.lateness)
        .where(F.col("type").isin(*ACTIVITY_TYPES))
        .groupBy(F.window("event_ts", MINUTE), "type")
        .agg(F.count("*").alias("events"))
        .select(*_bounds(), "type", "events")
    )


def active_users(events: DataFrame, cfg: AnalyticsConfig) -> DataFrame:
    """Distinct acting users over 10 minutes, every minute (hopping); approximate (HyperLogLog++).

    ``active_users_approx`` has a relative standard deviation of ``ACTIVE_USERS_RSD``; below a
    few hundred users HyperLogLog++ counts exactly.
    """
    return (
        events.withWatermark("event_ts", cfg.lateness)
        .groupBy(F.window("event_ts", ACTIVE_WINDOW, ACTIVE_SLIDE))
        .agg(
            F.approx_count_distinct("user_id", rsd=ACTIVE_USERS_RSD).alias("active_users_approx"),
            F.count("*").alias("events"),
        )
        .select(*_bounds(), "active_users_approx", "events")
    )


def sessions(events: DataFrame, cfg: AnalyticsConfig) -> DataFrame:
    """User sessions: a user's events with gaps under 5 minutes (session windows).

    ``session_end`` is Spark's: the last event + the gap; ``length_ms`` is last - first event.
    """
    return (
        events.withWatermark("event_ts", cfg.lateness)
        .groupBy(F.session_window("event_ts", SESSION_GAP).alias("session"), "user_id")
        .agg(
            F.count("*").alias("events"),
            F.min("event_time").alias("first_event_time"),
            F.max("event_time").alias("last_event_time"),
        )
        .select(
            "user_id",
            F.col("session.start").alias("session_start"),
            F.col("session.end").alias("session_end"),
            "events",
            (F.col("last_event_time") - F.col("first_event_time")).alias("length_ms"),
        )
    )


def with_watermark(events: DataFrame, cfg: AnalyticsConfig) -> DataFrame:
    """The input of the late-events query: all events, with the windows' watermark declared."""
    return events.withWatermark("event_ts", cfg.lateness)


def batch_watermark_ms(checkpoint: Path, batch_id: int) -> int:
    """The watermark Spark used for micro-batch ``batch_id`` (from the query's offset log)."""
    lines = (Path(checkpoint) / "offsets" / str(batch_id)).read_text().splitlines()
    return int(json.loads(lines[1]).get("batchWatermarkMs", 0))


def late_in_batch(batch: DataFrame, closed_ms: int, newest_ms: int) -> DataFrame:
    """Late events of one micro-batch, per one-minute window and type (see the module docstring).

    ``closed_ms``: the previous batch's watermark (windows ending at or before it are closed);
    ``newest_ms``: the largest event time seen before this batch.
    """
    behind = F.lit(newest_ms) - F.col("event_time")
    return (
        batch.withColumn("window", F.window("event_ts", MINUTE))
        .where(F.col("window.end") <= F.timestamp_millis(F.lit(closed_ms)))
        .withColumn("behind_ms", behind)
        .groupBy("window", "type")
        .agg(
            F.count("*").alias("late_events"),
            F.min("behind_ms").alias("min_behind_ms"),
            F.max("behind_ms").alias("max_behind_ms"),
        )
        .select(
            *_bounds(),
            "type",
            "late_events",
            "min_behind_ms",
            "max_behind_ms",
            F.timestamp_millis(F.lit(closed_ms)).alias("closed_before"),
        )
    )
