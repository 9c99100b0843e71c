"""``make compare``: Lambda vs Kappa on the same generated log, side by side.

One log, both ways of recomputing every view from it:

- **Kappa**: the speed layer's own processor replayed over the log into a scratch Redis namespace
  (:func:`pipelines.replay.replay_keyed`): one code path, live and replayed.
- **Lambda**: the batch layer (:mod:`pipelines.batch_layer`) over the Delta archive of the same
  log: a second, set-based implementation beside the speed layer.

Reported: recompute time and events/s of each; freshness (the batch layer's staleness at its
hourly schedule vs the speed layer's p99 from the latest ``make bench`` keyed run); lines of code
each path needs; rows compared and disagreements (the cross-check ``verify`` uses); a plot.
Writes ``var/reports/compare/latest.json``, ``latest.html`` and ``compare.png``.

``python -m stories.compare [--events N]``. Uses the running local stack if Kafka answers on the
configured port, else starts Kafka and Redis and stops them afterwards.
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from contract.functions import connect as keyed_connect
from infra.cli import command_name, run_main
from infra.html import render as render_page
from infra.settings import REPO_ROOT, Settings, get_settings
from stories.bench_common import backbone_unless_running

SCHEDULE_S = 3600  # the batch_layer DAG runs hourly (dags/batch_layer.py)
# The code each path adds (the contract checks, the Kafka source and the archive are shared).
KAPPA_FILES = [
    "pipelines/speed/processor.py",
    "contract/functions.py",
    "pipelines/speed/stream.py",
    "contract/redis_functions/social.lua",
    "pipelines/replay.py",
]
LAMBDA_FILES = ["pipelines/batch_layer/definition.py", "pipelines/batch_layer/job.py"]


def code_lines(path: Path) -> int:
    """Lines of code: not blank, not a comment, not inside a docstring / block comment."""
    n, in_block = 0, False
    for line in path.read_text().splitlines():
        s = line.strip()
        if in_block:
            if s.endswith('"""') or s.endswith("]]"):
                in_block = False
            continue
        if s.startswith(('"""', "--[[")):
            rest = s[3:] if s.startswith('"""') else s[4:]
            if not (rest.endswith('"""') or rest.endswith("]]")):
                in_block = True
            continue
        if s and not s.startswith(("#", "--")):
            n += 1
    return n


def loc(files: list[str]) -> dict:
    per = {f: code_lines(REPO_ROOT / f) for f in files}
    return {"files": per, "total": sum(per.values())}


def speed_layer_freshness(settings: Settings) -> dict:
    """The speed layer's freshness p99 from the latest ``make bench`` keyed run, if there is one."""
    path = Path(settings.reports_dir) / "bench" / "latest.json"
    keyed = json.loads(path.read_text()).get("sections", {}).get("keyed", {}) if path.exists() else {}
    rates = sorted(
        int(k.split("_")[1]) for k in keyed if k.startswith("freshness_") and k.endswith("_p99_ms")
    )
    if not rates:
        return {
            "p99_ms": None,
            "source": f"no keyed bench run in {path}",
            "why_none": "not measured here: a replay has no receive times to be fresh against; "
            "`make bench` (section keyed) measures it on a live stream, and this report then cites it",
        }
    rate = rates[0]
    return {
        "p50_ms": keyed.get(f"freshness_{rate}_p50_ms"),
        "p99_ms": keyed.get(f"freshness_{rate}_p99_ms"),
        "at_events_per_s": rate,
        "source": f"{path} (keyed, run {keyed.get('run_id')})",
    }


def freshness_text(fresh: dict) -> str:
    """The speed layer's freshness in words: its p99 (and p50) with where it comes from, or why
    there is none (never ``None`` where a figure belongs)."""
    if fresh.get("p99_ms") is None:
        return fresh.get("why_none") or f"not measured ({fresh.get('source')})"
    p50 = f"p50 {fresh['p50_ms']} ms, " if fresh.get("p50_ms") is not None else ""
    at = f" at {fresh['at_events_per_s']:,} events/s" if fresh.get("at_events_per_s") else ""
    return f"{p50}p99 {fresh['p99_ms']} ms{at} (make bench)"


def run(settings: Settings, events: int) -> dict:
    """Both recomputes of one generated log of ``events`` events, on a topic, a Redis namespace
    and Delta tables of their own (removed afterwards); the report (:func:`_report`)."""
    from app_sim.generator import GeneratorConfig, produce
    from contract.functions import drop_namespace
    from infra.stack import create_topic, delete_topic, end_offsets
    from pipelines.spark import build_spark

    run_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    topic = f"compare.{run_id}".lower()
    kappa_ns, archive_ns = f"compare-kappa-{run_id}".lower(), f"compare-{run_id}".lower()
    create_topic(settings, topic, settings.events_partitions)
    client = keyed_connect(settings.redis_url)
    lake = settings.lake_dir
    spark = build_spark("compare", settings)
    try:
        gen = GeneratorConfig(
            users=max(200, events // 100), seed=7, mean_followers=30, invalid_share=0.01, duplicate_share=0.01
        )
        produce(events, gen, topic=topic, bootstrap=settings, progress=False)
        ends = end_offsets(settings, topic)
        recomputed = _recompute(spark, settings, client, topic, ends, kappa_ns, archive_ns)
        return _report(settings, run_id, ends, recomputed)
    finally:
        spark.stop()
        drop_namespace(client, kappa_ns)
        for d in lake.glob(f"{archive_ns}*"):
            shutil.rmtree(d, ignore_errors=True)
        try:
            delete_topic(settings, topic)
        except Exception as exc:  # cleanup must not hide the results
            print(f"warning: could not delete topic {topic}: {exc}", file=sys.stderr)


def _recompute(
    spark, settings: Settings, client, topic: str, ends: dict[int, int], kappa_ns: str, archive_ns: str
) -> dict:
    """Kappa's replay into ``kappa_ns``, the archive of the log and Lambda's batch layer over it
    (``archive_ns``), timed, and the cross-check of both results row for row."""
    from pipelines.batch_layer.archive import archive_log
    from pipelines.batch_layer.cross_check import changelog_dispositions, cross_check
    from pipelines.batch_layer.definition import BatchViews
    from pipelines.batch_layer.job import run as batch_run
    from pipelines.replay import replay_keyed

    lake = settings.lake_dir
    t = time.perf_counter()
    counts = replay_keyed(spark, settings, topic, ends, kappa_ns)
    kappa_s = time.perf_counter() - t

    t = time.perf_counter()
    archive_log(spark, settings, topic, ends, lake / archive_ns)
    archive_s = time.perf_counter() - t
    lam = batch_run(spark, settings, namespace=archive_ns, upto=ends)

    out_root = lake / lam["out_namespace"]
    views = BatchViews(
        **{f: spark.read.format("delta").load(str(out_root / f)) for f in BatchViews.__dataclass_fields__}
    )
    partitions = sorted(ends)
    live_disp = spark.createDataFrame(
        changelog_dispositions(client, kappa_ns, partitions, settings.serving_layout),
        "partition INT, offset BIGINT, disposition STRING, reason STRING",
    )
    check = cross_check(
        spark,
        client,
        kappa_ns,
        views,
        ends,
        settings.timeline_length,
        live_dispositions=live_disp,
        layout=settings.serving_layout,
        fanout_threshold=settings.fanout_threshold,
    )
    return {"counts": counts, "kappa_s": kappa_s, "archive_s": archive_s, "lambda": lam, "check": check}


def _report(settings: Settings, run_id: str, ends: dict[int, int], recomputed: dict) -> dict:
    """The comparison's report from :func:`_recompute`'s timings and cross-check, with the
    speed layer's freshness (:func:`speed_layer_freshness`), the code each path needs and the advice."""
    n = sum(ends.values())
    kappa_s, lam, check = recomputed["kappa_s"], recomputed["lambda"], recomputed["check"]
    lambda_s = lam["seconds"]
    kappa_loc, lambda_loc = loc(KAPPA_FILES), loc(LAMBDA_FILES)
    report = {
        "run_id": run_id,
        "events": n,
        "position": {str(p): o for p, o in ends.items()},
        "kappa": {
            "what": "the speed layer's processor replayed over the log into a scratch Redis namespace",
            "recompute_seconds": round(kappa_s, 1),
            "events_per_s": round(n / kappa_s),
            "counts": recomputed["counts"],
            "freshness": speed_layer_freshness(settings),
            "code_lines": kappa_loc,
        },
        "lambda": {
            "what": "the batch layer over the Delta archive of the same log, views written to Delta",
            "recompute_seconds": lambda_s,
            "events_per_s": round(n / lambda_s),
            "archive_seconds": round(recomputed["archive_s"], 1),
            "staleness": {
                "schedule_s": SCHEDULE_S,
                "mean_s": round(SCHEDULE_S / 2 + lambda_s),
                "worst_s": round(SCHEDULE_S + lambda_s),
            },
            "accounting": lam["accounting"],
            "files_per_table": {k: v["files"] for k, v in lam["tables"].items()},
            "code_lines": lambda_loc,
            "code_lines_lambda_total": kappa_loc["total"] + lambda_loc["total"],
        },
        "agreement": {
            "rows_compared": check["rows_compared"],
            "disagreements": check["mismatches"],
            "ok": check["ok"],
            "views": {
                k: {kk: v[kk] for kk in ("live_rows", "batch_rows", "mismatches", "examples")}
                for k, v in check["views"].items()
            },
        },
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    report["advice"] = advice(report)
    return report


def advice(r: dict) -> list[str]:
    k, lam = r["kappa"], r["lambda"]
    faster = "Lambda's batch layer" if lam["recompute_seconds"] < k["recompute_seconds"] else "Kappa's replay"
    ratio = max(lam["recompute_seconds"], k["recompute_seconds"]) / max(
        min(lam["recompute_seconds"], k["recompute_seconds"]), 1e-3
    )
    p99 = k["freshness"].get("p99_ms")
    fresh = (
        f"the speed layer serves every view within {p99} ms p99"
        if p99 is not None
        else f"the speed layer's p99 is {freshness_text(k['freshness'])}"
    )
    return [
        f"Freshness: {fresh}; the batch layer's views are "
        f"{lam['staleness']['mean_s']} s old on average at an hourly schedule. Only the speed layer can serve reads.",
        f"Recompute: {faster} recomputed this log {ratio:.1f}x faster "
        f"(Kappa {k['recompute_seconds']} s, Lambda {lam['recompute_seconds']} s, plus {lam['archive_seconds']} s "
        "to archive it, which the archiver does continuously in production).",
        f"Code: Kappa is one path of {k['code_lines']['total']} lines; Lambda keeps those and adds "
        f"{lam['code_lines']['total']} lines that must mean exactly the same ({r['agreement']['disagreements']} "
        f"disagreements over {r['agreement']['rows_compared']} rows here).",
        "Pick Kappa (this project's serving path) when one code path and replay-time rebuilds are "
        "acceptable: every change is written once. Add the batch layer when an independent second "
        "implementation is worth its upkeep (auditing, catching a bug both a replay and the live "
        "stream would share), when rebuilds must run from the archive after the log's retention, or "
        "when a full recompute must be faster than a replay through the keyed store.",
    ]


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2), dpi=100)
    names, colors = ["Kappa replay", "Lambda batch"], ["#4c78a8", "#f58518"]
    axes[0].bar(names, [r["kappa"]["recompute_seconds"], r["lambda"]["recompute_seconds"]], color=colors)
    axes[0].set_title(f"recompute {r['events']:,} events (s)")
    p99 = r["kappa"]["freshness"].get("p99_ms")
    axes[1].bar(names, [(p99 or 0) / 1000, r["lambda"]["staleness"]["mean_s"]], color=colors)
    axes[1].set_yscale("log")
    if p99 is None:
        axes[1].text(0, 1, "not measured\n(make bench)", ha="center", va="bottom", fontsize=8)
    axes[1].set_title("freshness: p99 vs mean staleness (s, log)")
    axes[2].bar(
        names,
        [r["kappa"]["code_lines"]["total"], r["lambda"]["code_lines_lambda_total"]],
        color=colors,
    )
    axes[2].set_title("lines of code to maintain")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write(report: dict, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"compare-{report['run_id']}.json").write_text(json.dumps(report, indent=2))
    (directory / "latest.json").write_text(json.dumps(report, indent=2))
    png = directory / "compare.png"
    plot(report, png)
    k, lam, a = report["kappa"], report["lambda"], report["agreement"]
    rows = [
        ("recompute (s)", k["recompute_seconds"], lam["recompute_seconds"]),
        ("events/s", f"{k['events_per_s']:,}", f"{lam['events_per_s']:,}"),
        (
            "freshness",
            freshness_text(k["freshness"]),
            f"mean {lam['staleness']['mean_s']} s, worst {lam['staleness']['worst_s']} s",
        ),
        (
            "lines of code",
            k["code_lines"]["total"],
            f"{lam['code_lines']['total']} more ({lam['code_lines_lambda_total']} with the speed layer)",
        ),
    ]
    page = render_page(
        "compare.html.j2",
        events=report["events"],
        run_id=report["run_id"],
        rows=[tuple(str(x) for x in row) for row in rows],
        png=base64.b64encode(png.read_bytes()).decode(),
        agreement=a,
        advice=report["advice"],
        freshness_source=str(k["freshness"].get("source")),
    )
    (directory / "latest.html").write_text(page)
    return directory / "latest.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=command_name("stories.compare"), description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000, help="events in the generated log (default 200k)")
    a = p.parse_args(argv)
    settings = get_settings()
    with backbone_unless_running(settings, "comparison"):
        report = run(settings, a.events)
    path = write(report, Path(settings.reports_dir) / "compare")
    k, lam, ag = report["kappa"], report["lambda"], report["agreement"]
    print(f"Lambda vs Kappa on {report['events']:,} events")
    print(
        f"  recompute: Kappa replay {k['recompute_seconds']} s ({k['events_per_s']:,}/s), "
        f"Lambda batch layer {lam['recompute_seconds']} s ({lam['events_per_s']:,}/s)"
    )
    print(
        f"  freshness: speed layer {freshness_text(k['freshness'])}; "
        f"batch layer mean staleness {lam['staleness']['mean_s']} s"
    )
    print(f"  code: Kappa {k['code_lines']['total']} lines; Lambda adds {lam['code_lines']['total']}")
    print(f"  agreement: {ag['rows_compared']:,} rows compared, {ag['disagreements']} disagreements")
    print(f"-> {path} and latest.html")
    return 0 if ag["ok"] else 1


if __name__ == "__main__":
    sys.exit(run_main(main, "stories.compare"))
