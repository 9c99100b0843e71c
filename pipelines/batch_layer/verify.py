"""``verify``'s Lambda check: the live keyed state in Redis == the batch layer at the same P.

P is the live state's fences (partition -> next offset). The batch layer recomputes every view
from the Delta archive up to P (in memory: verify writes nothing but its report) and
:func:`pipelines.batch_layer.cross_check.cross_check` compares them view by view; the
dispositions are also compared with the speed layer's verdicts as archived (``events_bronze``'s
``disposition``/``reason``, which the batch layer itself never reads).

``python -m pipelines.batch_layer.verify [--namespace NS] [--redis-namespace NS]`` prints the
result as JSON (exit 1 on a disagreement); ``pipelines.verify`` includes it in its report.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from contract import functions, namespaces
from contract.functions import connect as keyed_connect
from infra.cli import command_name, run_main
from infra.settings import Settings, get_settings
from pipelines.batch_layer.cross_check import cross_check
from pipelines.batch_layer.definition import QUARANTINED, BatchViews, below
from pipelines.batch_layer.job import Archive, batch_config, views_at


def verify_batch_layer(
    spark: SparkSession,
    settings: Settings,
    namespace: str,
    redis_namespace: str | None = None,
    *,
    computed: tuple[dict[int, int], BatchViews] | None = None,
    topic: str | None = None,
) -> dict:
    """Compare the keyed state of ``redis_namespace`` (default ``namespace``) with the batch layer
    over ``namespace``'s archive, both at the keyed state's position.

    ``computed``: batch views the caller already has, and the position they are at; used when
    that is the keyed state's position (``verify`` computes them at the Delta views' position,
    which is the same once the stream has caught up). ``topic``: the log the state was built from
    (default ``SOCIAL_EVENTS_TOPIC``), whose partition count the partitioned layout's keys follow."""
    client = keyed_connect(settings.redis_url)
    redis_namespace = redis_namespace or namespace
    layout = settings.serving_layout
    archive = Archive(spark, settings.lake_dir / namespace)
    if not archive.exists():
        return {"ok": None, "skipped": f"no archive at {archive.root}"}
    if layout == "partitioned":
        from pipelines.speed.stream import topic_partitions

        partitions = len(topic_partitions(settings, topic or settings.events_topic))
        position, complete = functions.partitioned_state(client, redis_namespace, partitions)
        if not complete:
            return {
                "ok": None,
                "skipped": "the live state is between a micro-batch's calls and its deliveries",
            }
    else:
        position = functions.fences(client, redis_namespace)
    if not position:
        return {"ok": None, "skipped": f"Redis namespace {redis_namespace!r} has applied nothing"}
    archived = archive.position()
    behind = {p: (archived.get(p, 0), o) for p, o in position.items() if archived.get(p, 0) < o}
    if behind:
        return {"ok": None, "skipped": f"the archive is behind the live state (archived, live): {behind}"}
    started = time.time()
    if computed is not None and {p: o for p, o in computed[0].items() if o} == {
        p: o for p, o in position.items() if o
    }:
        views = computed[1]
    else:
        views = views_at(spark, archive, position, batch_config(settings))
    verdicts = (
        below(archive.read("events_bronze"), position)
        .where(F.col("disposition").isNotNull())
        .select("partition", "offset", "disposition", "reason")
    )
    live_dispositions: DataFrame | None = None  # an archive written without the speed layer's verdicts
    if not verdicts.isEmpty():
        live_dispositions = verdicts
        views = replace(views, dispositions=views.dispositions.where(F.col("disposition") != QUARANTINED))
    result = cross_check(
        spark,
        client,
        redis_namespace,
        views,
        position,
        settings.timeline_length,
        live_dispositions=live_dispositions,
        layout=layout,
        fanout_threshold=settings.fanout_threshold,
    )
    spark.catalog.clearCache()
    result["seconds"] = round(time.time() - started, 1)
    result["redis_namespace"] = redis_namespace
    return result


def summary(result: dict) -> str:
    if result.get("views") is None:
        return f"  keyed state vs batch layer: {result.get('skipped')}"
    lines = [
        f"  keyed state vs batch layer at {result['position']}: {result['rows_compared']} rows, "
        f"{result['mismatches']} disagreements ({result.get('skipped') or ('ok' if result['ok'] else 'MISMATCH')})"
    ]
    for name, v in result["views"].items():
        for ex in v["examples"]:
            lines.append(f"    {name} {ex['key']}: live {ex['live']} batch {ex['batch']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from pipelines.spark import build_spark

    p = argparse.ArgumentParser(
        prog=command_name("pipelines.batch_layer.verify"), description=__doc__.splitlines()[0]
    )
    p.add_argument("--namespace", help="the archive's namespace (default: the active one)")
    p.add_argument("--redis-namespace", help="the keyed state to compare (default: --namespace)")
    args = p.parse_args(argv)
    settings = get_settings()
    namespace = args.namespace or namespaces.active(settings)
    result = verify_batch_layer(
        build_spark("verify_batch_layer", settings), settings, namespace, args.redis_namespace
    )
    print(json.dumps(result, indent=2, default=str))
    return 1 if result["ok"] is False else 0


if __name__ == "__main__":
    sys.exit(run_main(main, "pipelines.batch_layer.verify"))
