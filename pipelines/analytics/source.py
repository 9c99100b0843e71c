"""The analytics' input: ``social.events`` as a stream of contract-valid events in event time.

The Kafka reader is the one every streaming reader of the log uses
(:func:`pipelines.speed.stream.kafka_stream`: the latency knobs live in one place).
Decoding is the project's one contract parse (:func:`pipelines.parse.parse_records`), without its
local checkpoint (a stream cannot be checkpointed); invalid records are the speed layer's
business (its quarantine), the analytics see only the valid ones.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from infra.settings import Settings
from pipelines.parse import parse_records
from pipelines.speed.stream import kafka_stream


def kafka_records(spark, settings: Settings, topic: str, max_offsets: int | None = None) -> DataFrame:
    """The event log as a stream of Kafka records, read as the speed layer's views query reads it."""
    return kafka_stream(spark, settings, topic, max_offsets)


def events(records: DataFrame) -> DataFrame:
    """Contract-valid events with ``event_ts``: the corrected event time as a TIMESTAMP.

    ``event_time`` (epoch ms) is device_time + (received_time - sent_time); windows, watermarks
    and joins run on ``event_ts``.
    """
    valid, _quarantine = parse_records(records, checkpoint=False)
    return valid.drop("raw").withColumn("event_ts", F.timestamp_millis("event_time"))
