"""An archive of a log that no speed layer archived: for the benchmarks and the compare report.

The speed layer's archiver appends ``events_bronze`` and ``quarantine`` as it goes, with its
verdicts (``disposition``, ``reason``). A benchmark needs the same layout for a log generated
just for it: this writes it in one pass (the contract checks of :mod:`pipelines.parse`), with
``disposition`` and ``reason`` left empty (the batch layer never reads them) and the position
it covers in the commit metadata (``end_offsets``), as :meth:`pipelines.batch_layer.job.Archive.position`
reads it.
"""

from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from infra.settings import Settings
from pipelines.parse import parse_records, received_date
from pipelines.replay import read_log
from pipelines.tables import TABLES


def archive_log(
    spark: SparkSession, settings: Settings, topic: str, end_offsets: dict[int, int], root: Path
) -> dict[str, int]:
    """Write ``topic`` up to ``end_offsets`` as ``root/events_bronze`` and ``root/quarantine``."""
    events, quarantine = parse_records(read_log(spark, settings, topic, end_offsets))
    meta = json.dumps({"end_offsets": {str(p): o for p, o in sorted(end_offsets.items())}})
    bronze = (
        events.withColumn("disposition", F.lit(None).cast("string"))
        .withColumn("reason", F.lit(None).cast("string"))
        .withColumn("received_date", received_date())
        .select(*TABLES["events_bronze"].columns)
    )
    (
        bronze.write.format("delta")
        .mode("overwrite")
        .partitionBy("received_date")
        .option("userMetadata", meta)
        .save(str(root / "events_bronze"))
    )
    (
        quarantine.select(*TABLES["quarantine"].columns)
        .coalesce(1)
        .write.format("delta")
        .mode("overwrite")
        .option("userMetadata", meta)
        .save(str(root / "quarantine"))
    )
    return {"events_bronze": spark.read.format("delta").load(str(root / "events_bronze")).count()}
