"""Data-quality reports: Great Expectations checkpoints over the raw-event archive, quarantine and views.

Where it sits: after the speed layer (reads one views namespace in Delta), beside ``verify``.
``verify`` proves the views equal a replay of the log; this checks properties a replay cannot
see being wrong in the same way twice (schemas, keys, ranges, referential integrity, the unread
invariant, the quarantine rate, freshness), and leaves human-readable Data Docs.

- The suites, validation definitions and checkpoints are a GX File Data Context committed in
  ``quality/gx/`` (GX's own files; only ``uncommitted/`` is ignored). Each suite names the *check
  frame* it validates in ``meta.frame``; one checkpoint per suite, of the same name, runs it.
  Thresholds that depend on the deployment are suite parameters (``{"$PARAMETER": ...}``) filled
  from settings at run time. Checkpoints name the columns that identify an offending row
  (``unexpected_index_column_names``), so Data Docs list e.g. the user, the counter and the
  inbox count of a broken unread counter, not "False x N".
- A check frame is a table of the namespace, a stream-analytics table (``analytics_<query>``;
  their suites are left out, and listed as skipped, when the analytics never wrote the table), or
  a derived frame computed here in Spark when a rule spans tables (GX validates one batch at a
  time): ``home_timeline_references`` (one boolean column per rule), ``unread_invariant`` (the
  counter beside the inbox count), ``log_health`` (one row of accounting and freshness).
- Tables are read at one consistent snapshot: the versions the last micro-batch recorded, unless
  a table was written since by something other than the speed layer (a repair, a corruption, a
  maintenance commit): then its latest version, since that is what readers see.
- Each checkpoint validates its frame as an in-memory Spark DataFrame (batch parameter) and
  updates the Data Docs site under ``var/reports/quality/`` (``QUALITY_DATA_DOCS_DIR`` in
  ``great_expectations.yml``, set here from the settings). A summary goes to
  ``var/reports/quality/latest.json``.

CLI: ``python -m pipelines.quality [--namespace NS] [--topic T] [--suite NAME ...]``; exit 1 when a
suite fails. ``--batch`` (or ``--namespace <ns>-batch``) checks the batch layer's views with the
same suites (:func:`batch_snapshot`). The ``data_quality`` DAG runs exactly this.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from infra import logs
from infra.cli import command_name, run_main
from infra.settings import REPO_ROOT, Settings, get_settings

log = logging.getLogger("quality")

CONTEXT_ROOT = REPO_ROOT / "quality"  # the GX project: quality/gx/
SUITES_DIR = CONTEXT_ROOT / "gx" / "expectations"
DOCS_SITE = "reports"
ANALYTICS = "analytics_"  # frame prefix of the stream-analytics tables: analytics_<query>
DAY_MS = 24 * 3600 * 1000


# Suites as data ----------------------------------------------------------------------------------


def load_suite_specs(names: Iterable[str] | None = None, suites_dir: Path = SUITES_DIR) -> list[dict]:
    """The suite JSON documents, by name (all when ``names`` is None), sorted by name."""
    specs = [json.loads(p.read_text()) for p in sorted(Path(suites_dir).glob("*.json"))]
    if names is not None:
        wanted = set(names)
        unknown = wanted - {s["name"] for s in specs}
        if unknown:
            raise ValueError(f"unknown suite(s): {', '.join(sorted(unknown))}")
        specs = [s for s in specs if s["name"] in wanted]
    return specs


def suite_parameters(settings: Settings, now_ms: int | None = None) -> dict:
    """Values of the ``$PARAMETER`` placeholders in the suites."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    return {
        # devices buffer offline and clocks are skewed, but not by a week into the future
        "max_plausible_time_ms": now_ms + 7 * DAY_MS,
        "max_quarantine_pct": float(settings.quality_max_quarantine_pct),
        "max_staleness_s": float(settings.quality_max_staleness_s),
    }


# A consistent snapshot of one namespace -------------------------------------------------------------


@dataclass
class Snapshot:
    namespace: str
    tables: dict  # table name -> DataFrame
    batch_id: int | None
    end_offsets: dict[int, int]
    versions: dict[str, int | None] = field(default_factory=dict)  # None = latest (written since)


def _commit_metadata(path: str, version: int) -> list[str | None]:
    """``userMetadata`` of every commit after ``version`` (the Delta log, read with delta-rs)."""
    from pipelines.lake import commit_metadata_since

    return commit_metadata_since(path, version)


def _written_since(spark, path: str, version: int, batch_id: int) -> bool:
    """True when a commit after ``version`` was not a speed-layer micro-batch newer than ``batch_id``.

    Cheap on purpose (the Delta log read with delta-rs, no Spark job): it runs for every table.
    """
    if "://" in path:  # object stores: ask Delta
        from delta.tables import DeltaTable

        rows = DeltaTable.forPath(spark, path).history(50).collect()
        metas = [r["userMetadata"] for r in rows if r["version"] > version]
    else:
        metas = _commit_metadata(path, version)
    for raw in metas:
        try:
            meta = json.loads(raw or "{}")
        except ValueError:
            meta = {}
        if not isinstance(meta, dict) or int(meta.get("batch_id", -1)) <= batch_id:
            return True
    return False


def consistent_versions(spark, lake, last) -> dict[str, int | None]:
    """Per table: the version ``last`` (a BatchRecord) recorded, or None (= latest) when the table was
    written since by something other than a newer speed-layer micro-batch (a repair, a corruption,
    a maintenance commit): that is what readers see, so that is what must be checked."""
    from pipelines.tables import STORED

    versions: dict[str, int | None] = {}
    for name in STORED:
        version = None
        if last is not None and name in last.versions:
            recorded = int(last.versions[name])
            if not _written_since(spark, lake.path(name), recorded, last.batch_id):
                version = recorded
        versions[name] = version
    return versions


def snapshot(spark, settings: Settings, namespace: str) -> Snapshot:
    """Every table of ``namespace`` as of its last micro-batch (see the module docstring); for a
    batch layer's namespace, :func:`batch_snapshot`."""
    from pipelines import derived
    from pipelines.lake import Lake, latest_metadata
    from pipelines.tables import TABLES

    if latest_metadata(settings.lake_dir / namespace / "accounting", "source") is not None:
        return batch_snapshot(spark, settings, namespace)
    lake = Lake(spark, settings.lake_dir, namespace)
    if not lake.exists():
        raise FileNotFoundError(f"no views namespace {namespace!r} under {settings.lake_dir}")
    last = lake.last_batch()
    versions = consistent_versions(spark, lake, last)
    return Snapshot(
        namespace=namespace,
        tables={name: derived.read(lake, name, versions, settings) for name in TABLES},
        batch_id=last.batch_id if last else None,
        end_offsets=dict(last.end_offsets) if last else {},
        versions=versions,
    )


def batch_snapshot(spark, settings: Settings, namespace: str) -> Snapshot:
    """The batch layer's views (``<ns>-batch``, ``pipelines/batch_layer/``) as the suites see the
    speed layer's: the same suites, the same frames, so both paths are checked alike.

    A batch run overwrites every view and writes ``accounting`` last, with the log position P and
    the archive namespace it read in the commit metadata: the views are read at their latest
    versions, ``events_bronze`` and ``quarantine`` from that archive below P (what the batch
    layer read), and ``batches`` is one row made from ``accounting`` (``quarantined`` = rejected
    + quarantined, as the speed layer counts them; visible when ``accounting`` was committed), so
    ``log_health`` checks the batch run's accounting and its staleness.
    """
    from pyspark.sql import functions as F

    from pipelines.lake import Lake, last_commit_ms, latest_metadata

    root = settings.lake_dir / namespace
    meta = latest_metadata(root / "accounting", "source")
    if meta is None:  # snapshot() checked; a direct call may name another namespace
        raise FileNotFoundError(f"no batch layer's views namespace {namespace!r} under {settings.lake_dir}")
    position = {int(p): int(o) for p, o in meta["position"].items()}
    archive = Lake(spark, settings.lake_dir, meta["source"])
    ends = spark.createDataFrame(sorted(position.items()), "partition INT, _end BIGINT")

    def below_p(name: str):
        df = archive.read(name, None)
        return df.join(F.broadcast(ends), "partition").where(F.col("offset") < F.col("_end")).drop("_end")

    tables = {
        name: spark.read.format("delta").load(str(root / name))
        for name in ("users", "follows", "posts", "home_timeline", "inbox", "unread_counts", "user_status")
    }
    acct = spark.read.format("delta").load(str(root / "accounting"))
    committed = last_commit_ms(root / "accounting", newest_of_all=True)
    tables["batches"] = acct.agg(
        F.lit(0).cast("bigint").alias("batch_id"),
        F.sum("records").cast("bigint").alias("events_read"),
        F.sum("applied").cast("bigint").alias("applied"),
        F.sum("duplicates").cast("bigint").alias("duplicates"),
        (F.sum("rejected") + F.sum("quarantined")).cast("bigint").alias("quarantined"),
        F.lit(committed).cast("bigint").alias("visible_at"),
    )
    tables["events_bronze"], tables["quarantine"] = below_p("events_bronze"), below_p("quarantine")
    return Snapshot(namespace=namespace, tables=tables, batch_id=None, end_offsets=position)


# Check frames: one boolean column per cross-table rule -----------------------------------------------


def home_timeline_references(snap: Snapshot, settings: Settings):
    """One row per home_timeline row: is the post live, is its author u or followed by u, is the
    timeline within N entries."""
    from pyspark.sql import functions as F

    t = snap.tables
    live = t["posts"].where(~F.col("deleted")).select("author_id", "post_id", F.lit(True).alias("_live"))
    follows = t["follows"].select(
        "user_id", F.col("followee_id").alias("author_id"), F.lit(True).alias("_follows")
    )
    lengths = t["home_timeline"].groupBy("user_id").agg(F.count(F.lit(1)).alias("_length"))
    return (
        t["home_timeline"]
        .join(live, ["author_id", "post_id"], "left")
        .join(follows, ["user_id", "author_id"], "left")
        .join(lengths, "user_id", "left")
        .select(
            "user_id",
            "post_id",
            "author_id",
            F.coalesce(F.col("_live"), F.lit(False)).alias("post_live"),
            ((F.col("author_id") == F.col("user_id")) | F.col("_follows").isNotNull()).alias(
                "author_followed"
            ),
            (F.col("_length") <= F.lit(settings.timeline_length)).alias("within_length"),
        )
    )


def unread_invariant(snap: Snapshot, settings: Settings):
    """One row per user with a counter or an inbox: counter == number of unread inbox rows."""
    from pyspark.sql import functions as F

    t = snap.tables
    from_inbox = (
        t["inbox"]
        .where(~F.col("read"))
        .groupBy(F.col("recipient_id").alias("user_id"))
        .agg(F.count(F.lit(1)).alias("inbox_unread"))
    )
    return (
        t["unread_counts"]
        .join(from_inbox, "user_id", "full")
        .select(
            "user_id",
            F.coalesce(F.col("unread"), F.lit(0)).alias("unread"),
            F.coalesce(F.col("inbox_unread"), F.lit(0)).alias("inbox_unread"),
        )
        .withColumn("counter_matches_inbox", F.col("unread") == F.col("inbox_unread"))
    )


def log_health(
    snap: Snapshot, settings: Settings, log_end: dict[int, int] | None = None, now_ms: int | None = None
):
    """One row (none before the first micro-batch): accounting over every batch and staleness.

    Staleness is 0 when the views cover the log's current end (an idle log is not stale), else
    the time since the last micro-batch became visible.
    """
    from pyspark.sql import functions as F

    spark = snap.tables["batches"].sparkSession
    agg = (
        snap.tables["batches"]
        .agg(
            F.count(F.lit(1)).alias("batches"),
            F.sum("events_read").alias("events_read"),
            F.sum("applied").alias("applied"),
            F.sum("duplicates").alias("duplicates"),
            F.sum("quarantined").alias("quarantined"),
            F.max("visible_at").alias("visible_at"),
        )
        .collect()[0]
    )
    ddl = (
        "events_read BIGINT, applied BIGINT, duplicates BIGINT, quarantined BIGINT, "
        "accounting_balanced BOOLEAN, quarantine_pct DOUBLE, caught_up BOOLEAN, staleness_s DOUBLE"
    )
    if not agg["batches"]:
        return spark.createDataFrame([], ddl)
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    read = int(agg["events_read"] or 0)
    quarantined = int(agg["quarantined"] or 0)
    from pipelines.lake import covers

    caught_up = log_end is not None and covers(snap.end_offsets, log_end)
    staleness = 0.0 if caught_up else max(0.0, (now_ms - int(agg["visible_at"] or 0)) / 1000)
    row = (
        read,
        int(agg["applied"] or 0),
        int(agg["duplicates"] or 0),
        quarantined,
        read == int(agg["applied"] or 0) + int(agg["duplicates"] or 0) + quarantined,
        100.0 * quarantined / read if read else 0.0,
        caught_up,
        staleness,
    )
    return spark.createDataFrame([row], ddl)


FRAMES: dict[str, Callable] = {
    "home_timeline_references": home_timeline_references,
    "unread_invariant": unread_invariant,
}


def analytics_table(settings: Settings, namespace: str, frame: str) -> Path:
    """Where the stream analytics keep the table of frame ``analytics_<query>``."""
    return settings.lake_dir / namespace / "analytics" / frame.removeprefix(ANALYTICS)


def check_frame(name: str, snap: Snapshot, settings: Settings, log_end: dict[int, int] | None = None):
    if name.startswith(ANALYTICS):
        spark = snap.tables["batches"].sparkSession
        return spark.read.format("delta").load(str(analytics_table(settings, snap.namespace, name)))
    if name == "log_health":
        return log_health(snap, settings, log_end)
    if name in FRAMES:
        return FRAMES[name](snap, settings)
    return snap.tables[name]


def log_end_offsets(settings: Settings, topic: str, timeout_s: float = 5.0) -> dict[int, int] | None:
    """Per-partition end offsets of the log (None when the broker does not answer)."""
    from infra.stack import end_offsets

    try:
        return end_offsets(settings, topic, timeout_s)
    except Exception:  # noqa: BLE001 - freshness then counts as unknown, not as a crash
        return None


# Running the checkpoints -----------------------------------------------------------------------------


@dataclass
class SuiteResult:
    suite: str
    frame: str
    success: bool
    evaluated: int
    failed: int
    rows: int
    failures: list[dict]
    seconds: float = 0.0  # its frame computed and checked, Data Docs included (where its time went)


@dataclass
class QualityResult:
    ok: bool
    namespace: str
    batch_id: int | None
    suites: list[SuiteResult]
    skipped: dict[str, str]  # suite -> why it did not run
    data_docs: str
    generated_at: str
    seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


def _context(settings: Settings):
    """The committed GX File Data Context (quality/gx), its Data Docs site under the reports dir."""
    import os

    import great_expectations as gx

    docs_dir = Path(settings.reports_dir) / "quality"
    os.environ["QUALITY_DATA_DOCS_DIR"] = str(docs_dir)  # ${QUALITY_DATA_DOCS_DIR} in great_expectations.yml
    return gx.get_context(mode="file", project_root_dir=str(CONTEXT_ROOT)), docs_dir


def _failures(validation) -> list[dict]:
    out = []
    for r in validation.results:
        if r.success:
            continue
        cfg = r.expectation_config
        result = r.result or {}
        out.append(
            {
                "expectation": cfg.type,
                "column": cfg.kwargs.get("column") or cfg.kwargs.get("column_list"),
                "observed": result.get("observed_value"),
                "unexpected_count": result.get("unexpected_count"),
                "examples": (result.get("partial_unexpected_list") or [])[:5],
                # the offending rows, by the checkpoint's unexpected_index_column_names
                "rows": (result.get("partial_unexpected_index_list") or [])[:20],
                "exception": (r.exception_info or {}).get("exception_message")
                if isinstance(r.exception_info, dict)
                else None,
            }
        )
    return out


def run_suites(
    spark,
    settings: Settings,
    frames: dict,
    specs: list[dict],
    parameters: dict | None = None,
    data_docs: bool = True,
) -> tuple[list[SuiteResult], Path]:
    """Run each suite's named checkpoint over its frame (``frames[spec.meta.frame]``)."""
    ctx, docs_dir = _context(settings)
    results = []
    for spec in specs:
        frame_name = spec["meta"]["frame"]
        df = frames[frame_name]
        checkpoint = ctx.checkpoints.get(spec["name"])
        t0 = time.monotonic()
        df = df.cache()  # GX computes its metrics in several Spark jobs over the same frame
        try:
            rows = df.count()
            batch = {"dataframe": df}
            if data_docs:
                outcome = checkpoint.run(batch_parameters=batch, expectation_parameters=parameters or {})
                validation = next(iter(outcome.run_results.values()))
            else:  # the checkpoint's validation, without its Data Docs action (rendering is slow)
                (definition,) = checkpoint.validation_definitions
                validation = definition.run(
                    batch_parameters=batch,
                    expectation_parameters=parameters or {},
                    result_format=checkpoint.result_format,
                )
        finally:
            df.unpersist()
        stats = validation.statistics
        results.append(
            SuiteResult(
                suite=spec["name"],
                frame=frame_name,
                success=bool(validation.success),
                evaluated=int(stats.get("evaluated_expectations", 0)),
                failed=int(stats.get("unsuccessful_expectations", 0)),
                rows=rows,
                failures=_failures(validation),
                seconds=round(time.monotonic() - t0, 1),
            )
        )
        log.info(
            "suite %s: %s (%d rows) in %.1fs",
            spec["name"],
            "ok" if validation.success else "FAILED",
            rows,
            results[-1].seconds,
        )
    return results, docs_dir


def run(
    settings: Settings,
    *,
    namespace: str | None = None,
    topic: str | None = None,
    suites: Iterable[str] | None = None,
    spark=None,
    log_end: dict[int, int] | None = None,
    data_docs: bool = True,
) -> QualityResult:
    """Validate one namespace with every suite (or the named ones); writes the reports."""
    from contract import namespaces

    started = time.monotonic()
    namespace = namespace or namespaces.active(settings)
    if spark is None:
        from pipelines.spark import build_spark

        spark = build_spark("data-quality", settings)
    specs = load_suite_specs(suites)
    snap = snapshot(spark, settings, namespace)
    skipped = {}
    for spec in specs:
        frame = spec["meta"]["frame"]
        path = analytics_table(settings, namespace, frame)
        if frame.startswith(ANALYTICS) and not (path / "_delta_log").exists():
            if suites is not None:
                raise FileNotFoundError(f"suite {spec['name']}: no analytics table {path}")
            skipped[spec["name"]] = f"no table {path} (the stream analytics did not write it)"
    specs = [s for s in specs if s["name"] not in skipped]
    if log_end is None and any(s["meta"]["frame"] == "log_health" for s in specs):
        log_end = log_end_offsets(settings, topic or settings.events_topic)
    frames = {s["meta"]["frame"]: check_frame(s["meta"]["frame"], snap, settings, log_end) for s in specs}
    results, docs_dir = run_suites(spark, settings, frames, specs, suite_parameters(settings), data_docs)
    report = QualityResult(
        ok=all(r.success for r in results),
        namespace=namespace,
        batch_id=snap.batch_id,
        suites=results,
        skipped=skipped,
        data_docs=str(docs_dir / "index.html"),
        generated_at=datetime.now(UTC).isoformat(timespec="seconds"),
        seconds=round(time.monotonic() - started, 1),
    )
    docs_dir.mkdir(parents=True, exist_ok=True)
    (docs_dir / "latest.json").write_text(json.dumps(report.as_dict(), indent=2, default=str) + "\n")
    from infra.reports import write_index

    write_index(settings)
    return report


def summary(report: QualityResult) -> str:
    lines = [
        f"data quality of namespace {report.namespace} (batch {report.batch_id}): {'ok' if report.ok else 'FAILED'}"
    ]
    for r in report.suites:
        lines.append(
            f"  {'ok    ' if r.success else 'FAILED'} {r.suite:<26} {r.rows:>10,} rows  "
            f"{r.evaluated - r.failed}/{r.evaluated}  {r.seconds:>5.1f}s"
        )
        for f in r.failures:
            lines.append(
                f"         - {f['expectation']} {f['column'] or ''}: observed {f['observed']} "
                f"examples {f['examples']} rows {f['rows']}"
            )
    for name, why in report.skipped.items():
        lines.append(f"  skipped {name}: {why}")
    lines.append(f"  Data Docs: {report.data_docs}")
    lines.append(f"  {report.seconds:.0f}s in all")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=command_name("pipelines.quality"), description=__doc__.splitlines()[0])
    p.add_argument("--namespace", help="views version to check (default: the active one)")
    p.add_argument("--topic", help="event topic, for freshness (default: SOCIAL_EVENTS_TOPIC)")
    p.add_argument("--suite", action="append", help="run only this suite (repeatable)")
    p.add_argument(
        "--batch", action="store_true", help="check the batch layer's views of the namespace (<ns>-batch)"
    )
    args = p.parse_args(argv)
    logs.configure("quality")
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    settings = get_settings()
    namespace = args.namespace
    if args.batch:
        from contract import namespaces
        from pipelines.batch_layer.job import SUFFIX

        namespace = (namespace or namespaces.active(settings)) + SUFFIX
    report = run(settings, namespace=namespace, topic=args.topic, suites=args.suite)
    print(summary(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(run_main(main, "pipelines.quality"))
