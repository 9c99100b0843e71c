"""Complex-event rules -> the alert stream (``social.alerts`` and the ``alerts`` Delta table).

Each rule is an event-time window aggregation per user (Spark's ``window``; the evidence is
collected with ``collect_list`` and matched with SQL higher-order functions, in the JVM) whose
rows cross a threshold from :class:`~pipelines.analytics.config.AnalyticsConfig` (settings
``SOCIAL_RULE_*``). The queries run in update mode, so an alert fires in the micro-batch whose
events cross the threshold, not when the window closes. An alert is raised once per
(rule, user, window): ``alert_id`` = ``<rule>:<user_id>:<window start, epoch ms>``, and carries
the ids of the events that fired it (those seen up to that micro-batch).

- ``burst``: more than ``burst_posts`` ``post_created`` by one user in one window of
  ``burst_window_s`` seconds; the windows slide by half their length, so any burst that fits in
  half a window is always caught (a longer one may fire in two overlapping windows).
- ``follow_churn``: at least ``churn_repeats`` churns by one user in one (tumbling) window of
  ``churn_window_s``; a churn is a ``followed`` whose ``unfollowed`` of the same followee comes
  at most ``churn_within_s`` later in event time (each such follow counts once).
- ``message_flood``: ``message_sent`` by one sender to at least ``flood_recipients`` distinct
  recipients in one (tumbling) window of ``flood_window_s``.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.analytics.config import AnalyticsConfig

ALERT_COLUMNS = (
    "alert_id",
    "rule",
    "user_id",
    "window_start",
    "window_end",
    "value",
    "threshold",
    "event_ids",
    "last_received_time",
)


def _alerts(agg: DataFrame, rule: str, value: str, threshold: int, fires) -> DataFrame:
    return agg.where(fires).select(
        F.concat_ws(":", F.lit(rule), F.col("user_id"), F.unix_millis("window.start")).alias("alert_id"),
        F.lit(rule).alias("rule"),
        "user_id",
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        F.col(value).cast("bigint").alias("value"),
        F.lit(threshold).cast("bigint").alias("threshold"),
        "event_ids",
        "last_received_time",
    )


def burst(events: DataFrame, cfg: AnalyticsConfig) -> DataFrame:
    """More than ``burst_posts`` posts by one user within one ``burst_window_s`` window."""
    length_ms = cfg.burst_window_s * 1000
    agg = (
        events.withWatermark("event_ts", cfg.lateness)
        .where(F.col("type") == "post_created")
        .groupBy(
            "user_id", F.window("event_ts", f"{length_ms} milliseconds", f"{length_ms // 2} milliseconds")
        )
        .agg(
            F.count("*").alias("posts"),
            F.collect_list("event_id").alias("event_ids"),
            F.max("received_time").alias("last_received_time"),
        )
    )
    return _alerts(agg, "burst", "posts", cfg.burst_posts, F.col("posts") > cfg.burst_posts)


def follow_churn(events: DataFrame, cfg: AnalyticsConfig) -> DataFrame:
    """At least ``churn_repeats`` follows undone within ``churn_within_s`` by one user in a window."""
    within = cfg.churn_within_s * 1000
    # u undoes f: the same followee, unfollowed at most `within` ms after the follow
    undone = (
        "u.type = 'unfollowed' AND u.followee_id = f.followee_id "
        f"AND u.event_time >= f.event_time AND u.event_time - f.event_time <= {within}"
    )
    churned = F.expr(f"filter(evs, f -> f.type = 'followed' AND exists(evs, u -> {undone}))")
    agg = (
        events.withWatermark("event_ts", cfg.lateness)
        .where(F.col("type").isin("followed", "unfollowed"))
        .groupBy("user_id", F.window("event_ts", f"{cfg.churn_window_s} seconds"))
        .agg(
            F.collect_list(F.struct("event_time", "type", "followee_id", "event_id")).alias("evs"),
            F.max("received_time").alias("last_received_time"),
        )
    )
    return _churn_alerts(agg, churned, undone, cfg)


def _churn_alerts(agg: DataFrame, churned, undone: str, cfg: AnalyticsConfig) -> DataFrame:
    # the evidence: each churned follow and the unfollow(s) that undid it, in event-time order
    evidence = F.expr(
        f"array_distinct(flatten(transform(filter(evs, f -> f.type = 'followed' AND "
        f"exists(evs, u -> {undone})), f -> concat(array(f.event_id), "
        f"transform(filter(evs, u -> {undone}), u -> u.event_id)))))"
    )
    with_value = agg.withColumn("churns", F.size(churned)).withColumn("event_ids", evidence)
    return _alerts(
        with_value, "follow_churn", "churns", cfg.churn_repeats, F.col("churns") >= cfg.churn_repeats
    )


def message_flood(events: DataFrame, cfg: AnalyticsConfig) -> DataFrame:
    """Messages from one sender to at least ``flood_recipients`` distinct users within a window."""
    agg = (
        events.withWatermark("event_ts", cfg.lateness)
        .where(F.col("type") == "message_sent")
        .groupBy("user_id", F.window("event_ts", f"{cfg.flood_window_s} seconds"))
        .agg(
            F.size(F.collect_set("recipient_id")).alias("recipients"),
            F.collect_list("event_id").alias("event_ids"),
            F.max("received_time").alias("last_received_time"),
        )
    )
    return _alerts(
        agg, "message_flood", "recipients", cfg.flood_recipients, F.col("recipients") >= cfg.flood_recipients
    )


RULES: dict[str, Callable[[DataFrame, AnalyticsConfig], DataFrame]] = {
    "burst": burst,
    "follow_churn": follow_churn,
    "message_flood": message_flood,
}
