"""``make bench`` section ``archive``: what an archive and its compaction cost, on a lake that
already holds the generator's default history.

The default 200,000-event log (``--catchup-events``) is folded by the speed layer (without its
archiver) into a namespace of its own at the configured threshold; this process then archives it
and compacts it (the history: what the archive does after a catch-up), appends ``archive_events``
(1,000) more events of the same world, and archives and compacts those (the steady state: a few
seconds of traffic on a lake that holds the history). The same calls the archiver makes
(:func:`pipelines.archiver.archive_once`, :func:`pipelines.compaction.compact_once`), in one Spark
session, timed one by one.

Yardsticks of the same run: a bare Spark read (a count) of the same Kafka offsets, for the history
and for the small range; and the serving path's own catch-up of the history (events/s), since
the archive's job is to keep up with it. Target (docs/performance.md): the small archive plus its
compaction within 10 s.
"""

from __future__ import annotations

import time
from pathlib import Path

from stories.bench_common import BenchContext, section, stream_settings, wait_applied

TARGET_SMALL_S = 10.0


def _bare_read(spark, settings, topic: str, starts: dict[int, int], ends: dict[int, int]) -> int:
    """Count the records of a range with Spark alone (the Kafka source, no parse): the yardstick."""
    from pipelines.replay import read_range

    return read_range(spark, settings, topic, starts, ends).count()


@section("archive")
def archive_section(ctx: BenchContext) -> dict:
    from app_sim.generator import GeneratorConfig, produce
    from contract.functions import connect, drop_namespace
    from infra.stack import end_offsets
    from pipelines.archiver import archive_once
    from pipelines.compaction import compact_once
    from pipelines.lake import Lake
    from pipelines.spark import build_spark
    from pipelines.speed import changelog
    from pipelines.speed_layer_process import SpeedLayerProcess
    from pipelines.verify import timed

    namespace = f"bench_archive_{ctx.run_id}".lower()
    topic = ctx.topic("archive")
    settings = stream_settings(ctx, "archive", topic, namespace)
    r = connect(settings.redis_url)
    sl = SpeedLayerProcess(
        settings, topic, namespace, Path(settings.var_dir) / "speed_layer.log", archive=False
    )
    sl.start()
    spark = build_spark("bench-archive", settings)
    out: dict = {"history_events": ctx.catchup_events, "small_events": ctx.archive_events}
    try:
        sl.wait_running()
        history = GeneratorConfig()
        t0 = time.monotonic()
        produce(ctx.catchup_events, history, topic=topic, bootstrap=settings, progress=False)
        ends = end_offsets(settings, topic)
        wait_applied(r, settings, ends, 1800, sl.log_path, "catch up in 30 minutes")
        serving_s = time.monotonic() - t0
        out["serving_history_events_per_s"] = round(sum(ends.values()) / serving_s)

        lake = Lake(spark, settings.lake_dir, namespace, writer="archiver")
        lake.ensure_tables()
        compactor = Lake(spark, settings.lake_dir, namespace, writer="compaction")
        timed(
            out,
            "history_archive_s",
            archive_once,
            spark,
            lake,
            r,
            settings,
            topic,
            changelog.cut(r, namespace),
        )
        timed(out, "history_compaction_s", compact_once, spark, compactor, settings)
        zero = {p: 0 for p in ends}
        timed(out, "history_bare_read_s", _bare_read, spark, settings, topic, zero, ends)

        # a few seconds of the same world's traffic (its graph, no registrations again)
        more = GeneratorConfig(seed=history.seed + 1, graph_seed=history.seed, emit_bootstrap=False)
        produce(ctx.archive_events, more, topic=topic, bootstrap=settings, progress=False)
        after = end_offsets(settings, topic)
        wait_applied(r, settings, after, 600, sl.log_path, f"apply {ctx.archive_events} events")
        timed(
            out, "small_archive_s", archive_once, spark, lake, r, settings, topic, changelog.cut(r, namespace)
        )
        timed(out, "small_compaction_s", compact_once, spark, compactor, settings)
        timed(out, "small_bare_read_s", _bare_read, spark, settings, topic, ends, after)
    finally:
        sl.stop()
        drop_namespace(r, namespace)
    small = out["small_archive_s"] + out["small_compaction_s"]
    out["small_total_s"] = round(small, 2)
    out["small_vs_target"] = round(small / TARGET_SMALL_S, 2)
    out["small_vs_bare_read"] = round(small / max(out["small_bare_read_s"], 1e-3), 1)
    history = out["history_archive_s"] + out["history_compaction_s"]
    out["history_events_per_s"] = round(ctx.catchup_events / history)
    out["history_vs_serving"] = round(out["history_events_per_s"] / out["serving_history_events_per_s"], 2)
    return out
