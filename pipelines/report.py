"""The verify report as one readable HTML page (``var/reports/verify/latest.html``).

``verify`` writes its result as JSON (the report contract: docs/reports.md) and calls
:func:`write_html` with the same dict. The page leads with the verdict and every comparison with
its outcome, the failed ones first with their examples (:func:`checks`); then the log position
P, one row per view (rows live, rows recomputed, mismatches, examples), the serving-store check,
the keyed state against its replay and against the batch layer, the accounting identity (events
read = applied + duplicates + quarantined) and the freshness of both paths (matplotlib, embedded
as a base64 PNG so the page is a single file that can be mailed or attached to an Airflow run).

Pure presentation: nothing here reads storage or imports Spark.
"""

from __future__ import annotations

import base64
import io
import json
import os
from pathlib import Path
from typing import Any

from infra.cli import command_name, run_main
from infra.html import render as render_page

FRESHNESS_CAP_MS = 120_000  # the speed layer's cap on a recorded delay (pipelines/speed/processor.py)


def _num(value: Any) -> str:
    """A figure as the page shows it: thousands separated, one decimal, "-" for none."""
    if isinstance(value, bool) or value is None:
        return str("-" if value is None else value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value)


def _json(value: Any, limit: int | None = 4000) -> str:
    return json.dumps(value, indent=1, default=str)[:limit]


def _kv_rows(data: dict) -> list[tuple[str, str, Any]]:
    """(key, how the cell shows: json / ok / text, value) for a table of one dict."""
    rows = []
    for key, value in data.items():
        if isinstance(value, dict | list):
            rows.append((key, "json", _json(value)))
        elif key == "ok":
            rows.append((key, "ok", value))
        else:
            rows.append((key, "text", _num(value)))
    return rows


def _view_rows(views: dict) -> list[dict]:
    return [
        {
            "name": name,
            "live_rows": _num(v.get("live_rows")),
            "recomputed_rows": _num(v.get("recomputed_rows")),
            "mismatches": _num(v.get("mismatches")),
            "ok": v.get("ok"),
            "examples": _json((v.get("examples") or [])[:5], None) if v.get("examples") else "",
        }
        for name, v in views.items()
    ]


def _count(part: Any) -> int | None:
    """Disagreements of one comparison (None when it has no count)."""
    if not isinstance(part, dict):
        return None
    if isinstance(part.get("mismatches"), int):
        return part["mismatches"]
    found = [v.get("mismatches") for v in part.values() if isinstance(v, dict)]
    counts = [c for c in found if isinstance(c, int)]
    return sum(counts) if counts else None


def checks(report: dict) -> list[dict]:
    """Every comparison of the report: name, ok (None: skipped), disagreements, what it means,
    the section below with the details; the failed ones first, then the skipped, then the rest."""
    views = report.get("views") or {}
    acct = report.get("accounting") or {}
    changelog = report.get("changelog") or {}
    rows = [
        {
            "name": "Delta views vs. recomputed from the log",
            "ok": all(v.get("ok") for v in views.values()) if views else None,
            "count": sum(v.get("mismatches") or 0 for v in views.values()) if views else None,
            "anchor": "views",
            "unit": "rows",
        },
        {
            "name": "Redis (serving store) vs. Delta views",
            "ok": (report.get("serving") or {}).get("ok"),
            "count": _count(report.get("serving")),
            "anchor": "serving",
            "unit": "rows",
        },
        {
            "name": "keyed state vs. its replay",
            "ok": (report.get("keyed") or {}).get("ok"),
            "count": _count(report.get("keyed")),
            "anchor": "keyed",
            "unit": "keys",
        },
        {
            "name": "keyed state vs. the batch layer",
            "ok": (report.get("batch_layer") or {}).get("ok"),
            "count": _count(report.get("batch_layer")),
            "anchor": "batch_layer",
            "unit": "rows",
        },
        {
            "name": "accounting: read = applied + duplicates + quarantined",
            "ok": acct.get("ok"),
            "count": None,
            "anchor": "accounting",
            "unit": "",
        },
        {
            "name": "Delta changelog: one entry per record below P",
            "ok": changelog.get("ok"),
            "count": changelog.get("duplicates"),
            "anchor": "more",
            "unit": "duplicates",
        },
    ]
    for row, part in zip(
        rows,
        (None, report.get("serving"), report.get("keyed"), report.get("batch_layer"), None, None),
        strict=True,
    ):
        row["skipped"] = (part or {}).get("skipped") if isinstance(part, dict) else None
    order = {False: 0, None: 1, True: 2}
    return sorted(rows, key=lambda r: order[None if r["ok"] is None else bool(r["ok"])])


def _failed_examples(report: dict, anchor: str) -> list:
    """A few examples of what disagreed in one comparison."""
    if anchor == "views":
        return [
            {"view": n, **e}
            for n, v in (report.get("views") or {}).items()
            for e in (v.get("examples") or [])[:3]
        ][:8]
    part = report.get(anchor) or {}
    groups = (
        part.get("families") or part.get("views") or {k: v for k, v in part.items() if isinstance(v, dict)}
    )
    return [
        {"in": n, **e} if isinstance(e, dict) else {"in": n, "example": e}
        for n, v in groups.items()
        if isinstance(v, dict)
        for e in (v.get("examples") or [])[:3]
    ][:8]


def freshness_plot(freshness: dict, keyed: dict | None = None) -> str | None:
    """A PNG (base64) of the freshness of both paths, or None when there is nothing to plot.

    ``freshness`` is the Delta views' (verify's ``series``: per compaction, when it became visible
    and its slowest event's delay, plus p50/p99 over every event); ``keyed`` the serving path's
    (received -> applied in Redis: p50/p99/max from the speed layer's histogram). The percentiles
    of both are bars on one log axis (a few compactions make no curve); with three or more
    compactions, their slowest events over time beside them.
    """
    import matplotlib

    matplotlib.use("Agg")  # no display; safe inside Airflow workers
    import matplotlib.pyplot as plt

    bars = []
    for label, src, keys in (
        ("Redis", keyed or {}, ("p50_ms", "p99_ms", "max_ms")),
        ("Delta", freshness or {}, ("p50_ms", "p99_ms")),
    ):
        bars += [(f"{label} {k[:-3]}", src[k]) for k in keys if src.get(k) is not None]
    series = sorted(
        (b for b in (freshness or {}).get("series") or [] if b.get("visible_at") is not None),
        key=lambda b: b["visible_at"],
    )
    if not bars and len(series) < 3:
        return None
    panels = 1 + (len(series) >= 3)
    fig, axes = plt.subplots(1, panels, figsize=(10, 3.2), dpi=100, squeeze=False)
    try:
        ax = axes[0][0]
        if bars:
            colors = ["#4c78a8" if name.startswith("Redis") else "#e45756" for name, _ in bars]
            values = [max(v, 1) / 1000 for _, v in bars]
            ax.barh([name for name, _ in bars], values, color=colors)
            ax.set_xscale("log")
            ax.set_xlim(left=min(0.01, min(values) / 10), right=max(values) * 3)  # bars from 10 ms
            ax.invert_yaxis()
            for i, (_, v) in enumerate(bars):
                ax.text(max(v, 1) / 1000, i, f" {v:,} ms", va="center", fontsize=8)
            ax.set_xlabel("server receive -> visible (s, log scale)")
            ax.set_title("freshness: Redis (serving path) and Delta views (archive)", fontsize=10)
        if len(series) >= 3:
            ax2 = axes[0][panels - 1]
            t0 = series[0]["visible_at"]
            ax2.plot(
                [(b["visible_at"] - t0) / 1000 for b in series],
                [(b.get("max_delay_ms") or 0) / 1000 for b in series],
                marker="o",
                color="#e45756",
            )
            ax2.set_xlabel("s since the first compaction verified")
            ax2.set_ylabel("slowest event (s)")
            ax2.set_ylim(bottom=0)
            ax2.set_title("Delta: slowest event per compaction", fontsize=10)
        return base64.b64encode(png_bytes(fig)).decode()
    finally:
        plt.close(fig)


def png_bytes(fig) -> bytes:
    """A matplotlib figure as PNG bytes (laid out tight), for the reports' embedded plots."""
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def render(report: dict) -> str:
    """The verify report as a self-contained HTML page (infra/templates/verify.html.j2)."""
    position = report.get("position") or {}
    freshness = report.get("freshness") or {}
    keyed = report.get("keyed") or {}
    keyed_fresh = keyed.get("freshness") or {}
    serving = report.get("serving") or {}
    all_checks = checks(report)
    for c in all_checks:
        c["count_text"] = "" if c["count"] is None else f"{_num(c['count'])} {c['unit']}"
        if c["ok"] is False:
            examples = _failed_examples(report, c["anchor"])
            c["examples"] = _json(examples) if examples else ""
    per_view = {k: v for k, v in serving.items() if isinstance(v, dict) and "live_rows" in v}
    families = keyed.get("families")
    known = {
        "ok",
        "namespace",
        "position",
        "views",
        "serving",
        "keyed",
        "batch_layer",
        "accounting",
        "freshness",
        "generated_at",
    }
    return render_page(
        "verify.html.j2",
        passed=bool(report.get("ok")),
        namespace=report.get("namespace", ""),
        failed_names=", ".join(c["name"] for c in all_checks if c["ok"] is False),
        checks=all_checks,
        failed=[c for c in all_checks if c["ok"] is False],
        position={
            "namespace": report.get("namespace", "-"),
            "batch_id": position.get("batch_id", "-"),
            "end_offsets": json.dumps(position.get("end_offsets", {})),
            "generated_at": report.get("generated_at", "-"),
        },
        views=_view_rows(report.get("views") or {}),
        serving={
            "views": _view_rows(per_view),
            "rest": _kv_rows({k: v for k, v in serving.items() if k not in per_view}),
        }
        if serving
        else None,
        keyed={
            "families": _view_rows(
                {n: {"live_rows": v.get("keys"), "recomputed_rows": None, **v} for n, v in families.items()}
            )
            if isinstance(families, dict)
            else [],
            "rest": _kv_rows({k: v for k, v in keyed.items() if k not in ("families", "freshness")}),
        }
        if keyed
        else None,
        batch_layer=_kv_rows(report.get("batch_layer") or {}),
        accounting=_kv_rows(report.get("accounting") or {}),
        fresh={
            "keyed_p50": _num(keyed_fresh.get("p50_ms")),
            "keyed_p99": _num(keyed_fresh.get("p99_ms")),
            "keyed_events": _num(keyed_fresh.get("events")),
            "delta_p50": _num(freshness.get("p50_ms")),
            "delta_p99": _num(freshness.get("p99_ms")),
            "delta_events": _num(freshness.get("events")),
            "capped": (keyed_fresh.get("p50_ms") or 0) >= FRESHNESS_CAP_MS,
        },
        png=freshness_plot(freshness, keyed_fresh),
        more=_kv_rows({k: v for k, v in report.items() if k not in known}),
    )


def write_html(report: dict, path: str | os.PathLike) -> Path:
    """Render ``report`` to ``path`` atomically (a reader never sees half a page); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render(report), encoding="utf-8")
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.report [REPORT_JSON [OUT_HTML]]``: re-render a verify report."""
    import argparse

    from infra.settings import get_settings

    default = get_settings().reports_dir / "verify" / "latest.json"
    p = argparse.ArgumentParser(prog=command_name("pipelines.report"), description=__doc__.splitlines()[0])
    p.add_argument("report", nargs="?", default=str(default))
    p.add_argument("out", nargs="?")
    args = p.parse_args(argv)
    src = Path(args.report)
    out = Path(args.out) if args.out else src.with_suffix(".html")
    print(write_html(json.loads(src.read_text()), out))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "pipelines.report"))
