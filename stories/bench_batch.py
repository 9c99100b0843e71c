"""``make bench`` section ``batch_layer``: Lambda's batch layer against a bare read of its input.

On generated logs of 1x, 3x and 10x ``batch_events / 10`` events (10x = 1M by default), each
archived once as the speed layer's archiver lays it out (:mod:`pipelines.batch_layer.archive`):

- the bare read: every archived event read from Delta into Spark's ``noop`` sink (the floor any
  job over the archive pays);
- the batch layer: every view recomputed from the same archive and written as Delta
  (:func:`pipelines.batch_layer.job.run`), events/s and the ratio to the bare read, in one run;
- the time curve (10x over 1x, must be <= 10) and the data files per output table (compacted);
- the floor under both targets: the 10x run's output tables read back and written again, as
  Delta and as plain Parquet (``output_copy_*``), what any batch layer producing these rows pays
  at least.

Where the time goes is in the Spark event log of the run (``var/spark-events/``) and summarised
by stage in the section's ``stages_10x`` (the slowest stages of the 10x run, from the UI's REST
API).
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from pathlib import Path

from stories.bench_common import BenchContext, fill_topic, section


def _stages(spark, top: int = 8) -> list[dict]:
    """The slowest completed stages of this session (name, seconds, tasks, shuffle bytes)."""
    sc = spark.sparkContext
    if not sc.uiWebUrl:
        return []
    port = sc.uiWebUrl.rsplit(":", 1)[1]
    url = f"http://127.0.0.1:{port}/api/v1/applications/{sc.applicationId}/stages?status=complete"
    with urllib.request.urlopen(url, timeout=30) as reply:
        stages = json.load(reply)
    stages.sort(key=lambda s: s.get("executorRunTime", 0), reverse=True)
    return [
        {
            "stage": s["stageId"],
            "name": s["name"][:80],
            "task_seconds": round(s.get("executorRunTime", 0) / 1000, 1),
            "tasks": s["numTasks"],
            "shuffle_write_mb": round(s.get("shuffleWriteBytes", 0) / 1e6, 1),
            "input_mb": round(s.get("inputBytes", 0) / 1e6, 1),
        }
        for s in stages[:top]
    ]


def _output_floor(spark, out_dir: Path, scratch: Path, events: int) -> dict:
    """What writing the batch layer's output alone costs: every output table read back and written
    again (no joins, no ranking), as Delta (with its per-file statistics) and as plain Parquet. No
    batch layer that produces these rows can be faster than the cheaper of the two; its events/s
    and its ratio to the bare read are the ceiling of both targets on this machine."""
    tables = sorted(p for p in out_dir.iterdir() if (p / "_delta_log").is_dir())
    rows = sum(spark.read.format("delta").load(str(t)).count() for t in tables)
    out: dict = {"output_rows_10x": rows}
    for fmt in ("delta", "parquet"):
        t0 = time.perf_counter()
        for table in tables:
            df = spark.read.format("delta").load(str(table))
            df.write.format(fmt).mode("overwrite").save(str(scratch / fmt / table.name))
        seconds = time.perf_counter() - t0
        out[f"output_copy_{fmt}_seconds_10x"] = round(seconds, 1)
        out[f"output_copy_{fmt}_ceiling_events_per_s_10x"] = round(events / seconds)
    shutil.rmtree(scratch, ignore_errors=True)
    return out


@section("batch_layer")
def batch_layer_section(ctx: BenchContext) -> dict:
    """Batch layer events/s vs a bare Spark read of the same archive; 1x/3x/10x; files per table."""
    from infra.stack import end_offsets
    from pipelines.batch_layer.archive import archive_log
    from pipelines.batch_layer.job import run
    from pipelines.spark import build_spark

    events_dir = Path(ctx.settings.var_dir) / "spark-events"
    events_dir.mkdir(parents=True, exist_ok=True)
    spark = build_spark(
        "bench-batch-layer",
        ctx.settings,
        extra_conf={
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": str(events_dir),
            "spark.eventLog.compress": "false",
        },
    )
    lake = Path(ctx.settings.lake_dir)
    out: dict = {"event_log": str(events_dir / spark.sparkContext.applicationId)}
    sizes = (("1x", ctx.batch_events // 10), ("3x", 3 * ctx.batch_events // 10), ("10x", ctx.batch_events))
    try:
        for label, n in sizes:
            topic, _ = fill_topic(ctx, f"batch{label}", n, users=max(200, n // 100), mean_followers=30)
            ends = end_offsets(ctx.settings, topic)
            ns = f"bench-batch-{label}-{ctx.run_id}".lower()
            t = time.perf_counter()
            archived = archive_log(spark, ctx.settings, topic, ends, lake / ns)
            archive_s = time.perf_counter() - t
            t = time.perf_counter()
            spark.read.format("delta").load(str(lake / ns / "events_bronze")).write.format("noop").mode(
                "overwrite"
            ).save()
            bare = time.perf_counter() - t
            result = run(spark, ctx.settings, namespace=ns, upto=ends)
            full = result["seconds"]
            out[f"events_{label}"] = archived["events_bronze"]
            out[f"archive_seconds_{label}"] = round(archive_s, 1)
            out[f"bare_read_events_per_s_{label}"] = round(n / bare)
            out[f"batch_layer_seconds_{label}"] = full
            out[f"batch_layer_events_per_s_{label}"] = round(n / full)
            out[f"batch_layer_vs_bare_ratio_{label}"] = round(bare / full, 3)
            out[f"accounting_ok_{label}"] = bool(result["ok"])
            if label == "10x":
                out["files_per_table"] = {name: t["files"] for name, t in result["tables"].items()}
                out["stages_10x"] = _stages(spark)
                out.update(_output_floor(spark, lake / result["out_namespace"], lake / f"{ns}-copy", n))
            for d in (lake / ns, lake / result["out_namespace"]):
                shutil.rmtree(d, ignore_errors=True)
        out["time_ratio_10x_over_1x"] = round(
            out["batch_layer_seconds_10x"] / out["batch_layer_seconds_1x"], 2
        )
        out["linear"] = out["time_ratio_10x_over_1x"] <= 10
        out["target_100k_events_per_s_met"] = out["batch_layer_events_per_s_10x"] >= 100_000
        out["target_half_bare_read_met"] = out["batch_layer_vs_bare_ratio_10x"] >= 0.5
    finally:
        spark.stop()
    return out
