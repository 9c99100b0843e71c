"""A test source for the analytics queries: Kafka-shaped records in files, one file per micro-batch.

``Log.batch(*events)`` adds one micro-batch; ``Log.run(names)`` runs the named queries over it with
``Trigger.AvailableNow`` and one file per trigger, so the micro-batches (and with them the
watermarks) are exactly the ones the test wrote down. Times are seconds after T0 (2026-01-01Z).
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pipelines.analytics import runner, source
from pipelines.analytics.config import AnalyticsConfig

T0_MS = 1_767_225_600_000
T0 = datetime(2026, 1, 1, tzinfo=UTC)
RECORD_DDL = "key BINARY, value BINARY, partition INT, offset BIGINT, timestamp TIMESTAMP"
_ids = itertools.count(1)


def at(seconds: float) -> datetime:
    """T0 + seconds, as Spark returns timestamps (naive, UTC session time zone)."""
    return (T0 + timedelta(seconds=seconds)).replace(tzinfo=None)


def ev(
    type_: str, user: int, t: float, *, received: float | None = None, skew_s: float = 0, **fields
) -> dict:
    """A contract-valid event whose corrected event time is T0 + t seconds.

    ``received`` (default t): when the server got it (an offline device flushes later);
    ``skew_s``: the device clock's error (device and sent time are off by it, corrected away).
    """
    recv = T0_MS + int((t if received is None else received) * 1000)
    device = T0_MS + int((t + skew_s) * 1000)
    sent = recv + int(skew_s * 1000)  # sent on the same (skewed) device clock, no network delay
    e = {
        "event_id": f"e{next(_ids)}",
        "type": type_,
        "schema_version": 1,
        "user_id": user,
        "device_time": device,
        "sent_time": sent,
        "received_time": recv,
    }
    defaults = {
        "post_created": {"post_id": 10_000 + next(_ids), "text": "hi"},
        "message_sent": {"message_id": 20_000 + next(_ids), "recipient_id": user % 7 + 1, "text": "yo"},
        "followed": {"followee_id": 99},
        "unfollowed": {"followee_id": 99},
        "message_read": {"message_id": 1},
        "status_updated": {"text": "ok"},
    }
    e.update(defaults.get(type_, {}))
    e.update(fields)
    return e


@dataclass
class Log:
    root: Path
    cfg: AnalyticsConfig = field(default_factory=lambda: AnalyticsConfig(lateness_s=60))
    batches: int = 0
    offset: int = 0

    @property
    def source(self) -> Path:
        return self.root / "log"

    @property
    def paths(self) -> runner.Paths:
        return runner.Paths(lake=self.root / "lake", checkpoints=self.root / "chk")

    def batch(self, *events: dict) -> None:
        self.source.mkdir(parents=True, exist_ok=True)
        lines = []
        for e in events:
            key = str(e.get("recipient_id", e["user_id"]) if e["type"] == "message_sent" else e["user_id"])
            lines.append(
                {
                    "key": key,
                    "value": json.dumps(e),
                    "partition": 0,
                    "offset": self.offset,
                    "timestamp": datetime.fromtimestamp(e["received_time"] / 1000, UTC).isoformat(),
                }
            )
            self.offset += 1
        path = self.source / f"batch-{self.batches:04d}.jsonl"
        path.write_text("\n".join(map(json.dumps, lines)) + "\n")
        # the file source takes files in modification-time order: one second apart, in batch order
        stamp = 1_700_000_000 + self.batches
        os.utime(path, (stamp, stamp))
        self.batches += 1

    def records(self, spark, per_trigger: int = 1):
        return (
            spark.readStream.schema(
                "key STRING, value STRING, partition INT, offset BIGINT, timestamp TIMESTAMP"
            )
            .option("maxFilesPerTrigger", per_trigger)
            .json(str(self.source))
            .selectExpr(
                "CAST(key AS BINARY) AS key",
                "CAST(value AS BINARY) AS value",
                "partition",
                "offset",
                "timestamp",
            )
        )

    def run(self, spark, names, per_trigger: int = 1, **kw) -> None:
        queries = runner.start(
            spark,
            lambda: source.events(self.records(spark, per_trigger)),
            self.paths,
            self.cfg,
            names=tuple(names),
            trigger=None,
            **kw,
        )
        for q in queries:
            q.awaitTermination()
            assert q.exception() is None, q.exception()

    def table(self, spark, name: str):
        return spark.read.format("delta").load(self.paths.table(name))
