"""Stream analytics on ``social.events``: event-time windows, stream joins, complex-event rules.

Separate Spark Structured Streaming queries beside the speed layer, on Spark's built-in JVM
operators (watermarks, ``window``, ``session_window``, ``approx_count_distinct``, time-bounded
stream-stream joins, the RocksDB state store), one module per query family:

- :mod:`~pipelines.analytics.windows`: ``activity_per_minute`` (tumbling), ``active_users``
  (hopping), ``sessions`` (session windows), ``late_events`` (what "late" means is defined there);
- :mod:`~pipelines.analytics.joins`: ``posts_enriched`` (stream-table), ``message_reads``
  (stream-stream, time to read, unread after 24 h);
- :mod:`~pipelines.analytics.rules`: ``burst``, ``follow_churn``, ``message_flood`` -> ``alerts``
  (Delta) and the ``social.alerts`` topic;
- :mod:`~pipelines.analytics.runner`: wiring to Kafka and Delta, ``python -m pipelines.analytics``;
- :mod:`~pipelines.analytics.report`: the HTML page under ``var/reports/analytics/``.
"""
