"""The analytics page: ``var/reports/analytics/index.html`` (plots) and ``summary.json``.

``python -m pipelines.analytics.report [--namespace NS] [--injected-user U ...]`` reads the
analytics' Delta tables (batch reads of what the streaming queries wrote) and draws what a person
looks at: activity per minute, the session-length distribution, time to read (and unread after
24 h), alerts over time (those of the users who acted out injected patterns, ``--injected-user``,
counted apart from everyone else's) and late events. A table without rows says why. Plots are
matplotlib PNGs embedded in the page, so it is one file.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import functions as F

from contract import namespaces
from infra.cli import command_name, run_main
from infra.html import render as render_page
from infra.settings import Settings, get_settings
from pipelines.analytics.joins import time_to_read_per_hour
from pipelines.analytics.runner import Paths

# Why a table can have no rows yet (the page says it instead of showing an empty table).
WINDOWED = "rows appear once the watermark (the latest event time seen minus the allowed lateness, {lateness} s) passes a window's end"
EMPTY_BECAUSE = {
    "activity_per_minute": WINDOWED,
    "active_users": WINDOWED,
    "sessions": WINDOWED + " (a session ends after 5 minutes without an event of its user)",
    "late_events": "no event arrived after the watermark had passed its one-minute window",
    "message_reads": "no message was sent and then read (or left unread for 24 h of event time) yet",
    "posts_enriched": "no post has been joined with its author's profile yet",
    "alerts": "no rule's threshold was crossed (SOCIAL_RULE_*)",
}
NOT_WRITTEN = "the query has not committed a micro-batch yet (see var/log/analytics.log)"

TABLES = (
    "activity_per_minute",
    "active_users",
    "sessions",
    "late_events",
    "message_reads",
    "posts_enriched",
    "alerts",
)


def _png(fig) -> str:
    """The figure as a base64 PNG, for an image embedded in the page."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(9, 3))


def collect(spark, paths: Paths, injected_users: tuple[int, ...] = (), lateness_s: int = 120) -> dict:
    """Everything the page shows, as plain Python data (also written as summary.json)."""
    out: dict = {"tables": {}, "empty_because": {}}
    frames = {}
    for name in TABLES:
        path = paths.lake / name  # a Path, or an ObjectPath on an s3a:// lake (Path() would make it local)
        if (path / "_delta_log").exists():
            frames[name] = spark.read.format("delta").load(str(path))
            out["tables"][name] = frames[name].count()
        else:
            out["tables"][name] = None
        if not out["tables"][name]:
            # late_events is written at the first late event (runner.LateEventsSink), not before
            missing = out["tables"][name] is None and name != "late_events"
            why = NOT_WRITTEN if missing else EMPTY_BECAUSE[name]
            out["empty_because"][name] = why.format(lateness=lateness_s)
    if "activity_per_minute" in frames:
        out["activity"] = [
            (r["window_start"].isoformat(), r["type"], r["events"])
            for r in frames["activity_per_minute"].orderBy("window_start").collect()
        ]
    if "sessions" in frames:
        s = frames["sessions"]
        out["session_length_s"] = [r["length_ms"] / 1000 for r in s.select("length_ms").collect()]
        out["sessions"] = s.count()
    if "message_reads" in frames:
        per_hour = time_to_read_per_hour(frames["message_reads"]).collect()
        out["time_to_read_per_hour"] = [
            {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in r.asDict().items()}
            for r in per_hour
        ]
        out["time_to_read_s"] = [
            r["t"] / 1000
            for r in frames["message_reads"]
            .where("read_within_24h")
            .select(F.col("time_to_read_ms").alias("t"))
            .collect()
        ]
        out["unread_after_24h"] = sum(r["unread_after_24h"] for r in per_hour)
    if "alerts" in frames:
        a = frames["alerts"]
        out["alerts_per_rule"] = {r["rule"]: r["count"] for r in a.groupBy("rule").count().collect()}
        origin = F.when(F.col("user_id").isin(*injected_users), "injected").otherwise("others")
        by_origin: dict[str, dict[str, int]] = {"injected": {}, "others": {}}
        for r in a.groupBy(origin.alias("origin"), "rule").count().collect():
            by_origin[r["origin"]][r["rule"]] = r["count"]
        out["alerts_by_origin"] = {k: dict(sorted(v.items())) for k, v in by_origin.items()}
        out["injected_users"] = list(injected_users)
        out["alerts"] = [
            (r["window_start"].isoformat(), r["rule"], r["user_id"], r["value"], r["threshold"])
            for r in a.orderBy("window_start").collect()
        ]
        lat = a.select((F.col("raised_at") - F.col("last_received_time")).alias("ms")).collect()
        ms = sorted(r["ms"] for r in lat if r["ms"] is not None)
        out["alert_latency_ms"] = {
            "p50": ms[len(ms) // 2] if ms else None,
            "p99": ms[min(len(ms) - 1, int(len(ms) * 0.99))] if ms else None,
        }
    if "late_events" in frames:
        late = (
            frames["late_events"]
            .groupBy("window_start", "type")
            .agg(F.sum("late_events").alias("n"), F.max("max_behind_ms").alias("behind"))
        )
        out["late"] = [
            (r["window_start"].isoformat(), r["type"], r["n"], r["behind"])
            for r in late.orderBy("window_start").collect()
        ]
        out["late_events"] = sum(r[2] for r in out["late"])
    return out


def _plots(data: dict) -> list[tuple[str, str]]:
    plots = []
    if data.get("activity"):
        fig, ax = _figure()
        for etype in sorted({t for _, t, _ in data["activity"]}):
            pts = [(datetime.fromisoformat(w), n) for w, t, n in data["activity"] if t == etype]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=etype)
        ax.set_ylabel("events per minute")
        ax.legend()
        plots.append(("Activity per minute (closed windows)", _png(fig)))
    if data.get("session_length_s"):
        fig, ax = _figure()
        ax.hist(data["session_length_s"], bins=40)
        ax.set_xlabel("session length, s (first to last event)")
        ax.set_ylabel("sessions")
        plots.append(("Session length", _png(fig)))
    if data.get("time_to_read_s"):
        fig, ax = _figure()
        ax.hist(data["time_to_read_s"], bins=40, log=True)
        ax.set_xlabel("time to read, s")
        ax.set_ylabel("messages")
        plots.append((f"Time to read ({data.get('unread_after_24h', 0):,} unread after 24 h)", _png(fig)))
    if data.get("alerts"):
        fig, ax = _figure()
        for rule in sorted({r for _, r, *_ in data["alerts"]}):
            ts = [datetime.fromisoformat(w) for w, r, *_ in data["alerts"] if r == rule]
            ax.plot(ts, range(1, len(ts) + 1), drawstyle="steps-post", label=rule)
        ax.set_ylabel("alerts (cumulative)")
        ax.legend()
        plots.append(("Alerts over time (by window start)", _png(fig)))
    if data.get("late"):
        fig, ax = _figure()
        ax.scatter(
            [datetime.fromisoformat(w) for w, *_ in data["late"]],
            [b / 1000 for *_, b in data["late"]],
            s=[4 + 4 * n for _, _, n, _ in data["late"]],
        )
        ax.set_ylabel("max behind, s")
        ax.set_yscale("log")
        plots.append(("Late events per window (size: how many)", _png(fig)))
    return plots


def render(data: dict, namespace: str) -> str:
    """The analytics page (infra/templates/analytics.html.j2)."""
    why = data.get("empty_because", {})
    tables = [
        {"name": k, "rows": "-" if v is None else f"{v:,}", "why": why.get(k, "") if not v else ""}
        for k, v in data["tables"].items()
    ]
    origin = data.get("alerts_by_origin", {})
    injected = ", ".join(str(u) for u in data.get("injected_users", [])) or "none named"
    facts = {
        "alerts per rule": data.get("alerts_per_rule", {}),
        f"alerts of the injected users ({injected})": origin.get("injected", {}),
        "alerts of all other users": origin.get("others", {}),
        "alert latency (event received -> raised), ms": data.get("alert_latency_ms", {}),
        "late events": data.get("late_events", 0),
        "unread after 24 h": data.get("unread_after_24h", 0),
    }
    return render_page(
        "analytics.html.j2",
        namespace=namespace,
        generated_at=datetime.now(UTC).isoformat(timespec="seconds"),
        tables=tables,
        facts=[(k, json.dumps(v)) for k, v in facts.items()],
        plots=_plots(data),
    )


def write(
    spark, settings: Settings, namespace: str | None = None, injected_users: tuple[int, ...] = ()
) -> Path:
    namespace = namespace or namespaces.active(settings)
    data = collect(
        spark, Paths.for_namespace(settings, namespace), tuple(injected_users), settings.analytics_lateness_s
    )
    out = Path(settings.reports_dir) / "analytics"
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(
        json.dumps({"namespace": namespace, **data}, indent=1, default=str) + "\n"
    )
    page = out / "index.html"
    page.write_text(render(data, namespace))
    return page


def main(argv: list[str] | None = None) -> int:
    from pipelines.spark import build_spark

    p = argparse.ArgumentParser(
        prog=command_name("pipelines.analytics.report"), description=__doc__.splitlines()[0]
    )
    p.add_argument("--namespace", help="lake namespace (default: the active one)")
    p.add_argument(
        "--injected-user",
        type=int,
        action="append",
        default=[],
        help="a user who acted out injected alert patterns (repeatable): their alerts are counted apart",
    )
    args = p.parse_args(argv)
    settings = get_settings()
    spark = build_spark("analytics-report", settings, extra_conf={"spark.ui.enabled": "false"})
    print(write(spark, settings, args.namespace, tuple(args.injected_user)))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "pipelines.analytics.report"))
