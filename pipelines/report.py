"""The verify report as one readable HTML page (``var/reports/verify/latest.html``).

``verify`` writes its result as JSON (the report contract in the README) and calls
:func:`write_html` with the same dict: a verdict, the log position P, one row per view (rows live,
rows recomputed, mismatches, examples), the serving-store check, the accounting identity
(events read = applied + duplicates + quarantined) and a freshness plot (matplotlib, embedded as
a base64 PNG so the page is a single file that can be mailed or attached to an Airflow run).

Pure presentation: nothing here reads storage or imports Spark.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from pathlib import Path
from typing import Any

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:70rem;color:#222}
h1{font-size:1.5rem} h2{font-size:1.15rem;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0;width:100%} th,td{border:1px solid #ddd;padding:.35rem .6rem;text-align:left;vertical-align:top}
th{background:#f5f5f5} td.num{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#137333;font-weight:600} .bad{color:#b3261e;font-weight:600}
.verdict{display:inline-block;padding:.3rem .8rem;border-radius:.3rem;color:#fff}
.verdict.ok{background:#137333;color:#fff} .verdict.bad{background:#b3261e;color:#fff}
pre{background:#f7f7f7;padding:.5rem;overflow-x:auto;font-size:.8rem;margin:0}
.muted{color:#666;font-size:.85rem}
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _ok(flag: Any) -> str:
    if flag is None:
        return '<span class="muted">n/a</span>'
    return '<span class="ok">ok</span>' if flag else '<span class="bad">MISMATCH</span>'


def _num(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return _e("-" if value is None else value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return _e(value)


def _kv_table(data: dict) -> str:
    rows = []
    for key, value in data.items():
        if isinstance(value, dict | list):
            cell = f"<pre>{_e(json.dumps(value, indent=1, default=str)[:4000])}</pre>"
        elif key == "ok":
            cell = _ok(value)
        else:
            cell = _num(value)
        rows.append(f"<tr><th>{_e(key)}</th><td>{cell}</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


def _views_table(views: dict) -> str:
    head = "<tr><th>view</th><th>rows live</th><th>rows recomputed</th><th>mismatches</th><th></th><th>examples</th></tr>"
    rows = []
    for name, v in views.items():
        examples = v.get("examples") or []
        ex = f"<pre>{_e(json.dumps(examples[:5], indent=1, default=str))}</pre>" if examples else ""
        rows.append(
            f"<tr><td>{_e(name)}</td><td class='num'>{_num(v.get('live_rows'))}</td>"
            f"<td class='num'>{_num(v.get('recomputed_rows'))}</td><td class='num'>{_num(v.get('mismatches'))}</td>"
            f"<td>{_ok(v.get('ok'))}</td><td>{ex}</td></tr>"
        )
    return "<table>" + head + "".join(rows) + "</table>"


def freshness_plot(freshness: dict) -> str | None:
    """A PNG (base64) of the freshness over the verified micro-batches, or None when there is nothing to plot.

    Verify's Delta freshness carries ``series`` (per micro-batch: when it became visible and its
    slowest event's delay); the keyed freshness only p50/p99, drawn as two bars.
    """
    import matplotlib

    matplotlib.use("Agg")  # no display; safe inside Airflow workers
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3), dpi=100)
    try:
        if freshness.get("series"):
            pts = sorted(freshness["series"], key=lambda b: b.get("visible_at") or b.get("batch_id", 0))
            t0 = pts[0].get("visible_at") or 0
            xs = [((b.get("visible_at") or t0) - t0) / 1000 for b in pts]
            ys = [(b.get("max_delay_ms") or 0) / 1000 for b in pts]
            ax.plot(xs, ys, marker="o", color="#e45756", label="slowest event of the micro-batch")
            for key, style in (("p50_ms", "--"), ("p99_ms", ":")):
                if freshness.get(key) is not None:
                    ax.axhline(freshness[key] / 1000, color="#333", linestyle=style, label=key[:3])
            ax.set_xlabel("time since the first micro-batch became visible (s)")
            ax.set_ylabel("receive -> visible (s)")
            ax.set_ylim(bottom=0)
            ax.legend()
        elif freshness.get("p50_ms") is not None or freshness.get("p99_ms") is not None:
            labels = [k for k in ("p50_ms", "p99_ms") if freshness.get(k) is not None]
            ax.bar(
                [k[:3] for k in labels],
                [freshness[k] / 1000 for k in labels],
                color=["#4c78a8", "#e45756"][: len(labels)],
            )
            ax.set_ylabel("freshness (s)")
        else:
            return None
        ax.set_title("freshness: server receive time -> visible in the serving store")
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
    """The verify report as a self-contained HTML page."""
    ok = bool(report.get("ok"))
    position = report.get("position") or {}
    freshness = report.get("freshness") or {}
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>verify {_e(report.get('namespace', ''))}: {'ok' if ok else 'MISMATCH'}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>Live views vs. a replay of the log</h1>",
        f"<p><span class='verdict {'ok' if ok else 'bad'}'>{'OK: live state equals the recompute' if ok else 'MISMATCH'}</span></p>",
        "<table>",
        f"<tr><th>namespace</th><td>{_e(report.get('namespace', '-'))}</td></tr>",
        f"<tr><th>log position P (batch)</th><td>{_e(position.get('batch_id', '-'))}</td></tr>",
        f"<tr><th>end offsets (partition: next offset)</th><td><pre>{_e(json.dumps(position.get('end_offsets', {})))}</pre></td></tr>",
        f"<tr><th>generated at</th><td>{_e(report.get('generated_at', '-'))}</td></tr>",
        "</table>",
        "<h2>Views (row for row at P)</h2>",
        _views_table(report.get("views") or {}),
    ]
    serving = report.get("serving") or {}
    if serving:
        per_view = {k: v for k, v in serving.items() if isinstance(v, dict) and "live_rows" in v}
        rest = {k: v for k, v in serving.items() if k not in per_view}
        parts.append("<h2>Serving store (Redis) vs. Delta</h2>")
        if per_view:
            parts.append(
                _views_table(per_view)
                .replace("rows recomputed", "rows in Delta")
                .replace("rows live", "rows in Redis")
            )
        if rest:
            parts.append(_kv_table(rest))
    if report.get("accounting"):
        parts += [
            "<h2>Accounting: events read = applied + duplicates + quarantined</h2>",
            _kv_table(report["accounting"]),
        ]
    parts.append("<h2>Freshness</h2>")
    parts.append(
        f"<p>p50 {_num(freshness.get('p50_ms'))} ms, p99 {_num(freshness.get('p99_ms'))} ms "
        "<span class='muted'>(server receive time to visible in the serving store)</span></p>"
    )
    png = freshness_plot(freshness) if freshness else None
    if png:
        parts.append(f"<img alt='freshness' src='data:image/png;base64,{png}'>")
    extra = {
        k: v
        for k, v in report.items()
        if k
        not in {"ok", "namespace", "position", "views", "serving", "accounting", "freshness", "generated_at"}
    }
    if extra:
        parts += ["<h2>More</h2>", _kv_table(extra)]
    parts.append("</body></html>")
    return "\n".join(parts)


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
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report", nargs="?", default=str(default))
    p.add_argument("out", nargs="?")
    args = p.parse_args(argv)
    src = Path(args.report)
    out = Path(args.out) if args.out else src.with_suffix(".html")
    print(write_html(json.loads(src.read_text()), out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
