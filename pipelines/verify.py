"""Verify: the live views equal a replay of the log, at exactly the log position they cover.

1. P = the end offsets of the latest committed micro-batch (``batches``), and the version of every
   table after it. The stream may keep running: the live tables are read *at those versions*.
2. What every table must hold at P, computed again without the speed layer: the views by the
   batch layer (:mod:`pipelines.batch_layer`, the project's one deliberate second implementation
   of docs/views.md) from the archive up to P; ``events_bronze`` and ``quarantine`` from the log
   itself up to P (the contract parse, :mod:`pipelines.parse`), with the batch layer's verdicts.
3. Compare row for row (every column), per table; also the accounting (events read = applied +
   duplicates + quarantined = the number of records below P), the Delta changelog (each record
   below P at most once: :func:`changelog_once`), the Redis serving store against
   the Delta views (when it covers the same batch), the keyed state against the same processor
   replayed over the log (:func:`verify_keyed`), and the keyed state against the batch layer at
   the keyed state's position (:mod:`pipelines.batch_layer.verify`).
4. Write ``var/reports/verify/latest.json`` (+ a timestamped copy and an HTML page); exit 1 on
   any mismatch.

CLI: ``python -m pipelines.verify [--namespace NS] [--topic T]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from contract import namespaces
from contract.functions import connect as keyed_connect
from infra import logs
from infra.cli import command_name, one_line, run_main
from infra.settings import Settings, get_settings
from pipelines import derived
from pipelines.batch_layer.definition import QUARANTINED, REJECTED, BatchViews, below
from pipelines.batch_layer.job import Archive, batch_config, views_at
from pipelines.batch_layer.verify import summary as batch_layer_summary
from pipelines.batch_layer.verify import verify_batch_layer
from pipelines.lake import Lake
from pipelines.parse import parse_records, received_date
from pipelines.replay import read_log
from pipelines.tables import STORED, TABLES, VIEWS

log = logging.getLogger("verify")
EXAMPLES = 5


def compare(live: DataFrame, recomputed: DataFrame, columns: list[str]) -> dict:
    """Row-for-row comparison (multiset over all columns) with a few examples of each side.

    One Spark job when the sides agree: both are tagged, unioned and counted per distinct row
    (``groupBy`` over every column, nulls equal, as ``exceptAll`` treats them), and one aggregate
    over those counts gives both row totals and the rows each side has in excess. Only a
    disagreement costs a second job, for its examples. (Each side is computed once either way.)
    """
    lv, rc = "_verify_live", "_verify_recomputed"
    counted = (
        live.select(*columns, F.lit(1).alias(lv), F.lit(0).alias(rc))
        .unionByName(recomputed.select(*columns, F.lit(0).alias(lv), F.lit(1).alias(rc)))
        .groupBy(*columns)
        .agg(F.sum(lv).alias(lv), F.sum(rc).alias(rc))
    )
    excess_live = F.greatest(F.col(lv) - F.col(rc), F.lit(0))
    excess_rec = F.greatest(F.col(rc) - F.col(lv), F.lit(0))
    totals = counted.agg(
        F.sum(lv).alias("live_rows"),
        F.sum(rc).alias("recomputed_rows"),
        F.sum(excess_live).alias("only_live"),
        F.sum(excess_rec).alias("only_recomputed"),
    ).first()
    assert totals is not None  # an aggregate without a grouping has one row
    n_live, n_rec = int(totals["only_live"] or 0), int(totals["only_recomputed"] or 0)
    examples: list[dict] = []
    for side, n, more in (("only_live", n_live, lv), ("only_recomputed", n_rec, rc)):
        if n:  # a disagreement: a few of the rows this side has more often than the other
            less = rc if more == lv else lv
            rows = counted.where(F.col(more) > F.col(less)).orderBy(*columns).limit(EXAMPLES).collect()
            examples += [{"side": side, **{c: row[c] for c in columns}} for row in rows]
    result = {
        "live_rows": int(totals["live_rows"] or 0),
        "recomputed_rows": int(totals["recomputed_rows"] or 0),
        "mismatches": n_live + n_rec,
        "only_live": n_live,
        "only_recomputed": n_rec,
        "examples": examples,
    }
    result["ok"] = result["mismatches"] == 0
    return result


def freshness(lake: Lake, up_to_batch: int) -> dict:
    """p50/p99 of (visible in the Delta views - received by the server) over all events, from ``batches``."""
    rows = (
        lake.read("batches")
        .where(F.col("batch_id") <= up_to_batch)
        .select("batch_id", "received_hist", "visible_at", "committed_at")
        .collect()
    )
    hist: dict[int, int] = {}
    series = []
    for r in rows:
        h = json.loads(r["received_hist"] or "{}")
        for bucket, n in h.items():
            delay = max(0, r["visible_at"] - int(bucket) * 100)
            hist[delay] = hist.get(delay, 0) + n
        if h:
            series.append(
                {
                    "batch_id": r["batch_id"],
                    "visible_at": r["visible_at"],
                    "max_delay_ms": max(r["visible_at"] - int(b) * 100 for b in h),
                }
            )
    total = sum(hist.values())
    if not total:
        return {"events": 0, "p50_ms": None, "p99_ms": None, "series": []}

    def pct(q: float) -> int:
        acc = 0
        for delay in sorted(hist):
            acc += hist[delay]
            if acc >= q * total:
                return delay
        return max(hist)

    series.sort(key=lambda s: s["batch_id"])
    return {
        "events": total,
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "max_ms": max(hist),
        "series": series[-500:],
    }


def accounting(lake: Lake, batch_id: int, end_offsets: dict[int, int]) -> dict:
    agg = (
        lake.read("batches")
        .where(F.col("batch_id") <= batch_id)
        .agg(*[F.sum(c).alias(c) for c in ("events_read", "applied", "duplicates", "quarantined")])
        .collect()[0]
        .asDict()
    )
    agg = {k: int(v or 0) for k, v in agg.items()}
    agg["records_below_position"] = int(sum(end_offsets.values()))
    agg["ok"] = (
        agg["events_read"] == agg["applied"] + agg["duplicates"] + agg["quarantined"]
        and agg["events_read"] == agg["records_below_position"]
    )
    return agg


def changelog_once(changelog: DataFrame, position: dict[int, int]) -> dict:
    """The Delta changelog below P holds each log record at most once (docs/architecture.md:
    the archiver's appends are fenced, so a re-run after a crash skips what was committed).

    The views and the archive's ``events_bronze`` and ``quarantine`` are compared with their
    recomputation as multisets (:func:`compare`), which catches a row written twice; the changelog
    is not recomputed, so its one-row-per-record property is checked here, in one job. (A
    namespace seeded at a position P0, a rebuild from the batch layer, archives only the records
    after P0: fewer rows than records is not an error, a record twice is.)
    """
    row = (
        below(changelog, position)
        .groupBy("partition", "offset")
        .count()
        .agg(F.count(F.lit(1)).alias("records"), F.sum("count").alias("rows"))
        .first()
    )
    assert row is not None  # an aggregate without a grouping has one row
    records, rows = int(row["records"] or 0), int(row["rows"] or 0)
    return {"rows": rows, "records": records, "duplicates": rows - records, "ok": rows == records}


def compare_serving(
    spark,
    lake: Lake,
    settings: Settings,
    end_offsets: dict[int, int],
    versions: dict,
    home_timeline: DataFrame | None = None,
    topic: str | None = None,
) -> dict:
    """The keyed state in Redis against the Delta views, when both cover the same log position.

    The Delta views are compacted from the changelog the Redis functions write, so this checks
    the archiver and the compaction; the Redis timelines are checked against ``home_timeline``
    derived from the Delta views (``home_timeline``: already derived, at ``versions``). Redis runs
    ahead of Delta while events flow; the comparison is made when they cover the same offsets (a
    caught-up stream) and skipped otherwise.
    """
    from contract.serving import PartitionedStore, ServingStore, connect
    from pipelines.speed.stream import topic_partitions

    client = connect(settings.redis_url)
    store: PartitionedStore | ServingStore
    if settings.serving_layout == "partitioned":
        store = PartitionedStore(
            client, lake.namespace, len(topic_partitions(settings, topic or settings.events_topic))
        )
    else:
        store = ServingStore(client, lake.namespace)
    covered = store.fences()
    wanted = {int(p): int(o) for p, o in end_offsets.items() if int(o) > 0}
    if {p: o for p, o in covered.items() if o > 0} != wanted:
        return {"ok": None, "skipped": f"Redis covers {covered}, the Delta views {wanted}"}
    out: dict[str, Any] = {}
    tl = list(store.dump_timelines(settings.timeline_length))
    redis_tl = spark.createDataFrame(tl, "user_id BIGINT, author_id BIGINT, post_id BIGINT")
    if settings.serving_layout == "partitioned":
        # its fan-out threshold is per partition (a representation): compared as users read it,
        # every followed author's posts merged, against the view derived with none held back
        home_timeline = derived.read(
            lake, "home_timeline", versions, dataclasses.replace(settings, fanout_threshold=2**62)
        )
    elif home_timeline is None:
        home_timeline = derived.read(lake, "home_timeline", versions, settings)
    out["home_timeline"] = compare(redis_tl, home_timeline, ["user_id", "author_id", "post_id"])
    unread = [(int(u), int(n)) for u, n in store.dump_hash("unread").items()]
    out["unread_counts"] = compare(
        spark.createDataFrame(unread, "user_id BIGINT, unread BIGINT"),
        lake.read("unread_counts", versions["unread_counts"]),
        ["user_id", "unread"],
    )
    status = [(int(u), json.loads(v)["text"]) for u, v in store.dump_hash("status").items()]
    out["user_status"] = compare(
        spark.createDataFrame(status, "user_id BIGINT, text STRING"),
        lake.read("user_status", versions["user_status"]),
        ["user_id", "text"],
    )
    out["ok"] = all(v["ok"] for v in out.values() if isinstance(v, dict))
    return out


def verify_keyed(spark, settings: Settings, namespace: str, topic: str) -> dict:
    """The live keyed state in Redis == the same processor replayed over the log up to its position.

    The state is compared in a frozen copy of the live Redis (:func:`infra.redis_copy.frozen_copy`:
    a replica detached once in sync), so a running stream never moves it during the comparison. P
    is the copy's fences; in the partitioned layout the copy first applies the deliveries its
    outboxes still hold (the stream's own recovery after a crash), which makes it whole at its
    fences. The replay runs :func:`pipelines.replay.replay_keyed` over the log up to P into a
    scratch namespace of the copy, then every key is compared by content. Where the live Redis
    cannot be copied (it refuses replication), the comparison runs in place and a stream that
    moves meanwhile makes it ``skipped``, never a false mismatch.
    """
    from contract import functions
    from infra.redis_copy import CopyError, frozen_copy

    # the libraries the live Redis runs (on a cluster, every master's: a copy holds one library)
    running = functions.loaded_versions(keyed_connect(settings.redis_url))
    try:
        with frozen_copy(settings.redis_url, Path(settings.var_dir) / "verify-copy" / namespace) as url:
            copy = dataclasses.replace(settings, redis_url=url)
            out = _verify_keyed(spark, copy, namespace, topic, True, running)
            return {**out, "compared_in": "a frozen copy of the live Redis (a detached replica)"}
    except CopyError as exc:
        out = _verify_keyed(spark, settings, namespace, topic, False, running)
        return {**out, "compared_in": f"the live Redis ({exc})"}


def _verify_keyed(
    spark, settings: Settings, namespace: str, topic: str, frozen: bool, versions: dict[str, str | None]
) -> dict:
    from contract import functions
    from contract.functions import drop_namespace
    from pipelines.replay import replay_keyed
    from pipelines.speed.compare import compare_namespaces
    from pipelines.speed.stream import processor_config, topic_partitions

    client = keyed_connect(settings.redis_url)
    partitions = topic_partitions(settings, topic)
    layout = settings.serving_layout
    # the library Redis runs, before the replay loads this repository's: a stale one is a mismatch
    name, want = (
        ("partitioned", functions.partitioned_version())
        if layout == "partitioned"
        else ("social", functions.version())
    )
    running = versions[name]
    library = {"name": name, "running": running, "repository": want, "ok": running in (want, None)}
    if frozen and layout == "partitioned":  # whole at its fences: what the outboxes hold, delivered
        from pipelines.speed.partitioned import PartitionedProcessor

        cfg = processor_config(settings, namespace, record_freshness=False, partitions=len(partitions))
        PartitionedProcessor(cfg, len(partitions), client=client).settle()

    def state():
        if layout == "partitioned":  # its own fences, and whether every delivery below is applied
            return functions.partitioned_state(client, namespace, len(partitions))
        return functions.fences(client, namespace), True

    position, complete = state()
    ends = {p: position.get(p, 0) for p in partitions}
    scratch = f"{namespace}__replay"
    drop_namespace(client, scratch)
    t0 = time.time()
    counts = replay_keyed(spark, settings, topic, ends, scratch)
    replay_s = time.time() - t0
    stats = functions.accounting(client, namespace, partitions, layout)
    result = compare_namespaces(client, namespace, scratch, settings.timeline_length)
    moved = state() != (position, complete)
    if not frozen:  # the copy goes with its scratch namespace; the live Redis keeps none
        drop_namespace(client, scratch)
    read = sum(ends.values())
    acct = dict(stats, events_read=read)
    acct["ok"] = read == stats["applied"] + stats["duplicates"] + stats["rejected"] + stats["quarantined"]
    if layout == "partitioned":  # a delivery a partition could not apply is kept and counted: a mismatch
        acct["ok"] = acct["ok"] and not stats.get("deliveries_quarantined")
    out = {
        "position": {str(p): o for p, o in ends.items()},
        "replay": {
            **counts,
            "seconds": round(replay_s, 1),
            "events_per_s": round(read / max(replay_s, 1e-3)),
        },
        "accounting": acct,
        "freshness": keyed_freshness(client, namespace, layout, partitions),
        "library": library,
        **result,
    }
    if moved or not complete:
        out["ok"] = None
        out["skipped"] = (
            "the live state moved past P during the comparison (the stream is running)"
            if moved
            else "the live state is between a micro-batch's calls and its deliveries (the stream is running)"
        )
    else:
        out["ok"] = result["ok"] and acct["ok"] and library["ok"]
    return out


def keyed_freshness(client, namespace: str, layout: str = "keyed", partitions=()) -> dict:
    """p50/p99 of received -> visible in Redis, from the processor's 10 ms histogram."""
    from contract import functions
    from pipelines.metrics import percentile
    from pipelines.speed.processor import FRESHNESS_BUCKET_MS

    hist = functions.freshness_histogram(client, namespace, layout, partitions)
    total = sum(hist.values())
    if not total:
        return {"events": 0, "p50_ms": None, "p99_ms": None}
    p50, p99, top = (percentile(hist, FRESHNESS_BUCKET_MS, q) for q in (0.5, 0.99, 1.0))
    return {"events": total, "p50_ms": p50, "p99_ms": p99, "max_ms": top}


def expected_tables(
    spark, settings: Settings, topic: str, position: dict[int, int], batch: BatchViews
) -> dict[str, DataFrame]:
    """Every Delta table's content at ``position``, computed again without the speed layer.

    The views are the batch layer's (``batch``, from the archive up to P). The archive itself is
    checked against the log: ``events_bronze`` = the contract-valid records below P with the
    batch layer's verdict (disposition and reason) for each, ``quarantine`` = the records that
    fail the contract plus those the batch layer rejects. A record archived twice or never is a
    mismatch (the verdicts are taken once per log position).
    """
    events, contract = parse_records(read_log(spark, settings, topic, position))
    verdicts = (
        batch.dispositions.where(F.col("disposition") != QUARANTINED)
        .select("partition", "offset", "disposition", "reason")
        .dropDuplicates(["partition", "offset"])
    )
    judged = events.join(verdicts, ["partition", "offset"], "left")
    bronze = judged.withColumn("received_date", received_date())
    rejected = judged.where(F.col("disposition") == REJECTED).select(*TABLES["quarantine"].columns)
    tables = {
        "events_bronze": bronze.select(*TABLES["events_bronze"].columns),
        "quarantine": contract.select(*TABLES["quarantine"].columns).unionByName(rejected),
    }
    return {**tables, **{name: getattr(batch, name) for name in VIEWS}}


# Appended by the archiver, which runs ahead of the compaction: they hold records past the views'
# position P, which the recomputation up to P does not.
ARCHIVE_TABLES = ("events_bronze", "quarantine")


def live_at(
    lake: Lake, name: str, versions: dict[str, int | None], position: dict[int, int], settings: Settings
) -> DataFrame:
    """What ``name`` holds at the log position ``position``: a view at the versions its batch
    recorded (a derived view from its tables there, :mod:`pipelines.derived`); the archive's
    tables, written on by the archiver since, as their rows below P (a record archived twice below P
    still shows as a mismatch; records past P are the next verify's)."""
    if name in ARCHIVE_TABLES:
        return below(lake.read(name), position)
    return derived.read(lake, name, versions, settings)


def _recorded(record) -> dict[str, int | None]:
    """The versions a batch recorded, as :func:`pipelines.quality.consistent_versions` gives them
    when nothing else wrote a table since."""
    return {name: record.versions.get(name) for name in STORED}


def timed(phases: dict[str, float], name: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, its wall time (seconds) recorded as ``phases[name]``."""
    t0 = time.monotonic()
    try:
        return fn(*args, **kwargs)
    finally:
        phases[name] = round(time.monotonic() - t0, 2)


def verify(
    spark,
    settings: Settings,
    *,
    namespace: str | None = None,
    topic: str | None = None,
    serving: bool = True,
    report_dir: Path | None = None,
) -> dict:
    namespace = namespace or namespaces.active(settings)
    topic = topic or settings.events_topic
    lake = Lake(spark, settings.lake_dir, namespace)
    started = time.time()
    record = lake.last_batch() if lake.exists() else None
    if record is None:
        raise SystemExit(f"verify: namespace {namespace!r} has no committed batch yet under {lake.root}")
    # The versions batch P recorded, except where something other than a newer micro-batch wrote a
    # table since (a repair, a corruption, maintenance): readers see that, so verify checks it.
    from pipelines.quality import consistent_versions

    versions = consistent_versions(spark, lake, record)
    position = {int(p): int(o) for p, o in record.end_offsets.items()}
    from pipelines.speed.stream import topic_partitions

    # a partition with no records, or none archived yet, is at position 0: nothing to compare there
    unarchived = [p for p in topic_partitions(settings, topic) if position.get(p, 0) == 0]
    phases: dict[str, float] = {}  # where the time went, seconds (the report's `phases`)
    batch = views_at(spark, Archive(spark, lake.root), position, batch_config(settings))
    # each view is compared twice (with the Delta views here, with Redis in the batch layer's
    # check): computed once, so neither comparison plans and runs the batch layer's lineage again
    batch = timed(
        phases,
        "batch_layer_views",
        lambda: dataclasses.replace(
            batch, **{name: getattr(batch, name).localCheckpoint() for name in VIEWS}
        ),
    )
    views, lives = {}, {}
    for name, df in expected_tables(spark, settings, topic, position, batch).items():
        lives[name] = live_at(lake, name, versions, position, settings)
        if not TABLES[name].stored:  # derived once, compared with the batch layer's and with Redis
            lives[name] = timed(phases, f"derive_{name}", lives[name].localCheckpoint)
        views[name] = timed(phases, f"compare_{name}", compare, lives[name], df, TABLES[name].columns)
        log.info("%s: %s", name, {k: v for k, v in views[name].items() if k != "examples"})
    disabled = {"ok": None, "skipped": "disabled"}
    report = {
        "namespace": namespace,
        "topic": topic,
        "position": {
            "batch_id": record.batch_id,
            "end_offsets": {str(k): v for k, v in record.end_offsets.items()},
            "at_zero": unarchived,
        },
        "table_versions": {
            name: record.versions.get(name) if v is None else v for name, v in versions.items()
        },
        "read_latest": sorted(name for name, v in versions.items() if v is None),
        "views": views,
        "accounting": timed(phases, "accounting", accounting, lake, record.batch_id, record.end_offsets),
        "changelog": timed(phases, "changelog", changelog_once, lake.read("changelog"), position),
        "freshness": freshness(lake, record.batch_id),
        "serving": timed(
            phases,
            "serving",
            compare_serving,
            spark,
            lake,
            settings,
            record.end_offsets,
            record.versions,
            home_timeline=lives["home_timeline"] if versions == _recorded(record) else None,
            topic=topic,
        )
        if serving
        else disabled,
        "keyed": timed(phases, "keyed", verify_keyed, spark, settings, namespace, topic)
        if serving
        else disabled,
        "batch_layer": timed(
            phases,
            "batch_layer",
            verify_batch_layer,
            spark,
            settings,
            namespace,
            computed=(position, batch),
            topic=topic,
        )
        if serving
        else disabled,
        "rows_verified": sum(v["recomputed_rows"] for v in views.values()),
        "seconds": round(time.time() - started, 1),
        "phases": phases,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    report["ok"] = (
        all(v["ok"] for v in views.values())
        and report["accounting"]["ok"]
        and report["changelog"]["ok"]
        and report["serving"]["ok"] is not False
        and report["keyed"]["ok"] is not False
        and report["batch_layer"]["ok"] is not False
    )
    write_report(report, report_dir or Path(settings.reports_dir) / "verify")
    return report


def verify_keyed_only(spark, settings: Settings, namespace: str, topic: str) -> dict:
    """``--keyed-only``: :func:`verify_keyed` alone (no Delta views), its report written to
    ``var/reports/verify/keyed.json`` (the whole check's ``latest.json`` is left as it was)."""
    keyed = verify_keyed(spark, settings, namespace, topic)
    report = {
        "namespace": namespace,
        "keyed": keyed,
        "ok": keyed["ok"] is not False,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    (Path(settings.reports_dir) / "verify").mkdir(parents=True, exist_ok=True)
    (Path(settings.reports_dir) / "verify" / "keyed.json").write_text(json.dumps(report, indent=2))
    return report


def write_report(report: dict, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    stamp = report["generated_at"].replace(":", "").replace("-", "")
    body = json.dumps(report, indent=2, default=str)
    (directory / f"verify-{stamp}.json").write_text(body)
    latest = directory / "latest.json"
    latest.write_text(body)
    try:
        from pipelines.report import write_html
    except ImportError:  # the HTML page is optional decoration; the JSON is the contract
        return latest
    write_html(report, directory / "latest.html")
    return latest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=command_name("pipelines.verify"), description=__doc__.splitlines()[0])
    p.add_argument("--namespace", help="views version to verify (default: the active one)")
    p.add_argument("--topic", help="event topic (default: SOCIAL_EVENTS_TOPIC)")
    p.add_argument("--no-serving", action="store_true", help="skip the Redis comparison")
    p.add_argument(
        "--keyed-only",
        action="store_true",
        help="only the keyed state in Redis vs its replay (no Delta views)",
    )
    args = p.parse_args(argv)
    logs.configure("verify")
    try:
        return _run(args)
    except Exception as exc:  # noqa: BLE001 - a failure is one line to the user; the trace is logged
        log.debug("verify failed", exc_info=True)
        line = one_line(command_name("pipelines.verify"), exc)  # a bad setting, a component down
        if line is None:
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            line = f"verify: failed: {type(exc).__name__}: {first}"
        print(line, file=sys.stderr)
        return 2


def _run(args) -> int:
    from pipelines.progress import spark_tasks
    from pipelines.spark import build_spark

    settings = get_settings()
    spark = build_spark("verify", settings, console_progress=False)  # its own bar below
    spark_tasks(spark, "verify")  # a progress bar on a terminal (pipelines/progress.py)
    if args.keyed_only:
        namespace = args.namespace or namespaces.active(settings)
        report = verify_keyed_only(spark, settings, namespace, args.topic or settings.events_topic)
        print(json.dumps({k: v for k, v in report["keyed"].items() if k != "families"}, indent=2))
        return 0 if report["keyed"]["ok"] else 1
    report = verify(spark, settings, namespace=args.namespace, topic=args.topic, serving=not args.no_serving)
    print(summary(report))
    return 0 if report["ok"] else 1


def summary(report: dict) -> str:
    lines = [
        f"verify {report['namespace']} at batch {report['position']['batch_id']} "
        f"(offsets {report['position']['end_offsets']}): {'OK' if report['ok'] else 'MISMATCH'}"
    ]
    if report["position"].get("at_zero"):
        lines.append(
            f"  partitions {report['position']['at_zero']} have nothing archived yet: position 0, "
            "nothing to compare there"
        )
    lines.append(f"  {'view':<15} {'live':>10} {'recomputed':>11} {'mismatches':>11}")
    for name, v in report["views"].items():
        lines.append(f"  {name:<15} {v['live_rows']:>10} {v['recomputed_rows']:>11} {v['mismatches']:>11}")
    a = report["accounting"]
    lines.append(
        f"  accounting: read {a['events_read']} = applied {a['applied']} + duplicates {a['duplicates']}"
        f" + quarantined {a['quarantined']} ({'ok' if a['ok'] else 'MISMATCH'})"
    )
    c = report["changelog"]
    lines.append(
        f"  Delta changelog below P: {c['rows']} rows for {c['records']} records "
        f"({'ok' if c['ok'] else str(c['duplicates']) + ' DUPLICATES'})"
    )
    s = report["serving"]
    lines.append(f"  serving store vs Delta: {s.get('skipped') or ('ok' if s['ok'] else 'MISMATCH')}")
    k = report.get("keyed", {})
    if k.get("families") is not None:
        lines.append(
            f"  keyed state vs its replay at {k['position']}: {k['keys']} keys, {k['mismatches']} mismatches"
            f" ({k.get('skipped') or ('ok' if k['ok'] else 'MISMATCH')}); replay {k['replay']['events_per_s']} events/s"
        )
        lib = k.get("library")
        if lib and not lib["ok"]:
            lines.append(
                f"  STALE Redis library {lib['name']}: Redis ran {lib['running']}, this repository is "
                f"{lib['repository']} (the next speed layer start loads it)"
            )
        kf = k["freshness"]
        lines.append(
            f"  keyed freshness p50 {kf['p50_ms']} ms, p99 {kf['p99_ms']} ms over {kf['events']} events"
        )
    else:
        lines.append(f"  keyed state vs its replay: {k.get('skipped')}")
    lines.append(batch_layer_summary(report.get("batch_layer", {})))
    f = report["freshness"]
    lines.append(f"  freshness p50 {f['p50_ms']} ms, p99 {f['p99_ms']} ms over {f['events']} events")
    if report.get("phases"):
        slowest = sorted(report["phases"].items(), key=lambda kv: -kv[1])[:4]
        lines.append(
            f"  {report['seconds']:.0f}s, most in: " + ", ".join(f"{name} {s:.0f}s" for name, s in slowest)
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(run_main(main, "pipelines.verify"))
