"""The batch layer's job: the Delta archive up to a log position P -> every view, in its own namespace.

Reads ``<lake_dir>/<namespace>/events_bronze`` and ``quarantine`` (the archive the speed layer's
archiver appends), computes :func:`pipelines.batch_layer.definition.compute` up to P and
overwrites one Delta table per view under ``<lake_dir>/<out namespace>/``. Every commit carries
``userMetadata`` ``{"position": P, "run_id": ...}``, and ``accounting`` is written last, so
:func:`batch_position` tells from the Delta log alone which P the batch views cover.

CLI: ``python -m pipelines.batch_layer [--namespace NS] [--upto archived|'{"0": 123, ...}']
[--out NS-batch]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from contract import namespaces
from infra.cli import command_name, run_main
from infra.lake_store import ObjectPath
from infra.settings import Settings, get_settings
from pipelines.batch_layer.definition import BatchConfig, BatchViews, compute
from pipelines.lake import delta_log, latest_metadata, location
from pipelines.tables import TABLES

SUFFIX = "-batch"
# What the views read of the archive (disposition and reason are the speed layer's: not read).
EVENT_COLUMNS = [
    "partition",
    "offset",
    "event_id",
    "type",
    "user_id",
    "received_time",
    "event_time",
    "handle",
    "display_name",
    "text",
    "followee_id",
    "post_id",
    "message_id",
    "recipient_id",
]
OWN_SCHEMAS = {
    "celebrities": "author_id BIGINT, followers BIGINT",
    "dispositions": "partition INT, offset BIGINT, event_id STRING, type STRING, disposition STRING, "
    "reason STRING",
    "accounting": "partition INT, end_offset BIGINT, records BIGINT, applied BIGINT, duplicates BIGINT, "
    "rejected BIGINT, quarantined BIGINT, missing BIGINT",
}
LARGE = {"home_timeline", "dispositions", "inbox", "posts", "follows"}  # two files, the rest one


def batch_config(settings: Settings) -> BatchConfig:
    return BatchConfig(
        timeline_length=settings.timeline_length,
        fanout_threshold=settings.fanout_threshold,
        dedup_window_ms=settings.dedup_window_ms,
        dedup_grace_ms=settings.dedup_grace_ms,
        dedup_reorder=settings.dedup_reorder,
    )


def columns(table: str) -> list[str]:
    ddl = OWN_SCHEMAS.get(table) or TABLES[table].ddl
    return [c.strip().split(" ")[0] for c in ddl.split(",")]


@dataclass
class Archive:
    """The Delta archive of one namespace: what the batch layer reads."""

    spark: SparkSession
    root: Path | ObjectPath

    def read(self, table: str) -> DataFrame:
        return self.spark.read.format("delta").load(str(self.root / table))

    def exists(self) -> bool:
        return (self.root / "events_bronze" / "_delta_log").exists()

    def position(self) -> dict[int, int]:
        """The log position the archive covers: the last ``end_offsets`` its commits recorded,
        else (an archive written without them) per partition the highest archived offset + 1."""
        recorded = _last_metadata(self.root / "events_bronze", "end_offsets")
        if recorded is not None:
            return {int(p): int(o) for p, o in recorded.items()}
        rows = (
            self.read("events_bronze")
            .select("partition", "offset")
            .unionByName(self.read("quarantine").select("partition", "offset"))
            .groupBy("partition")
            .agg(F.max("offset").alias("last"))
            .collect()
        )
        return {int(r["partition"]): int(r["last"]) + 1 for r in rows}


def _last_metadata(table_dir: Path | ObjectPath, key: str):
    """``key`` of the newest commit's ``userMetadata`` that has it (read from the Delta log alone)."""
    meta = latest_metadata(table_dir, key)
    return None if meta is None else meta[key]


def batch_position(lake_dir: Path, out_namespace: str) -> dict[int, int] | None:
    """The log position the batch views of ``out_namespace`` cover (from ``accounting``'s commit)."""
    got = _last_metadata(location(lake_dir) / out_namespace / "accounting", "position")
    return None if got is None else {int(p): int(o) for p, o in got.items()}


def parse_position(text: str) -> dict[int, int] | None:
    """``--upto``: ``archived`` (None) or JSON ``{"partition": end offset}``; clear error otherwise."""
    if text == "archived":
        return None
    try:
        raw = json.loads(text)
        position = {int(p): int(o) for p, o in raw.items()}
    except (ValueError, AttributeError, TypeError) as exc:
        raise SystemExit(
            f"--upto: expected 'archived' or JSON {{partition: end offset}}, got {text!r}"
        ) from exc
    if any(o < 0 for o in position.values()):
        raise SystemExit(f"--upto: negative end offset in {text!r}")
    return position


def views_at(spark: SparkSession, archive: Archive, position: dict[int, int], cfg: BatchConfig) -> BatchViews:
    """The batch views at ``position``, with the archive read once (kept for the several views)."""
    bronze = archive.read("events_bronze").select(*EVENT_COLUMNS).persist(StorageLevel.MEMORY_AND_DISK)
    quarantine = archive.read("quarantine").select("partition", "offset", "event_id", "type", "reason")
    return compute(bronze, quarantine, position, cfg, keep=computed_once)


def computed_once(df: DataFrame) -> DataFrame:
    """Shared by several views: computed once, now, and kept (memory, spilling to disk)."""
    df = df.persist(StorageLevel.MEMORY_AND_DISK)
    df.count()
    return df


def write_views(views: BatchViews, root: Path, meta: dict, *, parallel: int = 9) -> dict[str, dict]:
    """Overwrite one Delta table per view (``accounting`` last); returns files and version per table.

    The tables are written side by side: a Delta commit is mostly driver-side latency (snapshot,
    log write, post-commit), which overlaps well; the shared inputs are already computed.
    """
    user_metadata = json.dumps(meta)

    def write(name: str, df: DataFrame) -> None:
        files = 2 if name in LARGE else 1
        (
            df.select(*columns(name))
            .coalesce(files)
            .write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .option("userMetadata", user_metadata)
            .save(str(root / name))
        )

    tables = views.tables()
    last = tables.pop("accounting")
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for f in [pool.submit(write, name, df) for name, df in tables.items()]:
            f.result()
    write("accounting", last)
    return {name: table_files(root / name) for name in [*tables, "accounting"]}


def table_files(path: Path) -> dict:
    """Data files of the table's current version and the version itself, from its Delta log."""
    log = delta_log(path)
    if log is None:
        return {"files": 0, "version": -1}
    return {"files": len(log.file_uris()), "version": log.version()}


def run(
    spark: SparkSession,
    settings: Settings,
    *,
    namespace: str,
    upto: dict[int, int] | None = None,
    out_namespace: str | None = None,
    cfg: BatchConfig | None = None,
) -> dict:
    """Recompute every view from ``namespace``'s archive up to ``upto`` (None: what is archived)."""
    archive = Archive(spark, settings.lake_dir / namespace)
    if not archive.exists():
        raise SystemExit(f"batch layer: no archive at {archive.root} (events_bronze missing)")
    out_namespace = out_namespace or namespace + SUFFIX
    if out_namespace == namespace:
        raise SystemExit("batch layer: the output namespace must differ from the archive's")
    started = time.time()
    archived = archive.position()
    position = archived if upto is None else upto
    beyond = {p: o for p, o in position.items() if o > archived.get(p, 0)}
    if beyond:
        raise SystemExit(f"batch layer: {beyond} is beyond what the archive covers ({archived})")
    run_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    views = views_at(spark, archive, position, cfg or batch_config(settings))
    meta = {
        "position": {str(p): o for p, o in sorted(position.items())},
        "run_id": run_id,
        "source": namespace,
    }
    tables = write_views(views, settings.lake_dir / out_namespace, meta)
    acct = [
        r.asDict()
        for r in spark.read.format("delta")
        .load(str(settings.lake_dir / out_namespace / "accounting"))
        .collect()
    ]
    spark.catalog.clearCache()
    totals = {
        k: sum(int(r[k]) for r in acct)
        for k in ("records", "applied", "duplicates", "rejected", "quarantined", "missing")
    }
    return {
        "namespace": namespace,
        "out_namespace": out_namespace,
        "position": meta["position"],
        "run_id": run_id,
        "seconds": round(time.time() - started, 2),
        "accounting": totals,
        "ok": totals["missing"] == 0
        and totals["records"]
        == totals["applied"] + totals["duplicates"] + totals["rejected"] + totals["quarantined"],
        "tables": tables,
    }


def main(argv: list[str] | None = None) -> int:
    from pipelines.spark import build_spark

    p = argparse.ArgumentParser(
        prog=command_name("pipelines.batch_layer"), description=__doc__.splitlines()[0]
    )
    p.add_argument("--namespace", help="the archive's namespace (default: the active one)")
    p.add_argument("--upto", default="archived", help="'archived' (default) or JSON {partition: end offset}")
    p.add_argument("--out", help=f"output namespace (default: <namespace>{SUFFIX})")
    args = p.parse_args(argv)
    settings = get_settings()
    upto = parse_position(args.upto)
    namespace = args.namespace or namespaces.active(settings)
    spark = build_spark("batch_layer", settings)
    result = run(spark, settings, namespace=namespace, upto=upto, out_namespace=args.out)
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(run_main(main, "pipelines.batch_layer"))
